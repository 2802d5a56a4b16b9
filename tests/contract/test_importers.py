"""vcdl.data.importers: text and tables round-trip; bad input is one line and writes nothing."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather
import pyarrow.parquet as pq
import pytest

from vcdl.data import (
    import_npz,
    import_table,
    import_text,
    list_datasets,
    make_pytext,
    open_dataset,
    read_arrays,
)
from vcdl.data.builtin import pytext_bytes
from vcdl.data.decoded import import_limit
from vcdl.data.importers import byte_windows, unigram_entropy
from vcdl.errors import DataError
from vcdl.store import WeightStore


@pytest.fixture
def store(tmp_path: Path) -> WeightStore:
    return WeightStore(str(tmp_path / "store"))


# --- text ----------------------------------------------------------------------------


def test_a_text_file_becomes_byte_token_rows_with_a_held_out_tail(
    store: WeightStore, tmp_path: Path
) -> None:
    text = ("The quick brown fox jumps over the lazy dog. " * 40).encode()
    path = tmp_path / "fox.txt"
    path.write_bytes(text)
    info = import_text(store, path, "fox", context=15, test_fraction=0.25)
    assert info.hints == {"vocab_size": 256, "context_length": 15}
    assert info.stats["unigram_entropy"] == pytest.approx(unigram_entropy(text))
    cut = int(len(text) * 0.75)
    train, test = (read_arrays(store, "fox", s)["tokens"] for s in ("train", "test"))
    assert train.dtype == np.uint8 and train.shape[1] == 16
    np.testing.assert_array_equal(train, byte_windows(text[:cut], 15))
    np.testing.assert_array_equal(test, byte_windows(text[cut:], 15))
    assert bytes(train[0]) == text[:16]


def test_a_folder_of_text_files_is_read_in_path_order(store: WeightStore, tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    (folder / "b").mkdir(parents=True)
    (folder / "a.txt").write_bytes(b"A" * 300)
    (folder / "b" / "c.txt").write_bytes(b"C" * 300)
    (folder / "skip.md").write_bytes(b"M" * 300)
    import_text(store, folder, "docs", context=7, test_fraction=0.2)
    train = read_arrays(store, "docs", "train")["tokens"]
    assert bytes(train[0]) == b"A" * 8
    joined = b"".join(bytes(r) for r in train)
    assert b"M" not in joined and b"\n\nCC" in joined


@pytest.mark.parametrize(
    ("setup", "kwargs", "match"),
    [
        (None, {}, "no such file or folder"),
        ("short", {"context": 64}, "make no rows of 65 tokens"),
        ("dir", {"pattern": "*.rst"}, "no file matches '\\*.rst'"),
        ("short", {"context": 0}, "context must be >= 1"),
        ("short", {"test_fraction": 1.0}, "test_fraction must be in \\(0, 1\\)"),
    ],
)
def test_bad_text_is_one_line_and_writes_nothing(
    store: WeightStore, tmp_path: Path, setup: str | None, kwargs: dict[str, object], match: str
) -> None:
    path = tmp_path / "in.txt"
    if setup == "short":
        path.write_bytes(b"tiny text")
    elif setup == "dir":
        path.mkdir()
        (path / "a.txt").write_text("x" * 100)
    with pytest.raises(DataError, match=match) as info:
        import_text(store, path, "t", **kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
    assert list_datasets(store) == []


def test_pytext_is_the_python_language_reference_as_bytes(store: WeightStore) -> None:
    text = pytext_bytes()
    assert len(text) > 300_000 and b'The "import" statement' in text
    info = make_pytext(store, context=128)
    assert info.fields == ("tokens",) and info.hints["vocab_size"] == 256
    rows = info.n_train + info.n_test
    assert rows == len(byte_windows(text[: int(len(text) * 0.9)], 128)) + len(
        byte_windows(text[int(len(text) * 0.9) :], 128)
    )
    reopened = open_dataset(store, "pytext")
    assert reopened.splits["train"].arrays["tokens"].shape == (129,)
    # The baseline a language model must beat, recorded with the rows.
    assert 3.0 < reopened.stats["unigram_entropy"] < 3.5
    assert reopened.stats == info.stats


def test_unigram_entropy_is_that_of_the_byte_frequencies() -> None:
    assert unigram_entropy(b"") == 0.0
    assert unigram_entropy(b"aaaa") == 0.0
    assert unigram_entropy(b"ab" * 50) == pytest.approx(np.log(2))
    assert unigram_entropy(bytes(range(256)) * 3) == pytest.approx(np.log(256))


# --- tables ----------------------------------------------------------------------------


def _table(rows: int = 40) -> pa.Table:
    rng = np.random.default_rng(3)
    features = rng.normal(size=(rows, 3)).astype(np.float32)
    return pa.table(
        {
            "features": pa.FixedSizeListArray.from_arrays(pa.array(features.reshape(-1)), 3),
            "label": pa.array(rng.integers(0, 4, size=rows), type=pa.int16()),
            "weight": pa.array(np.linspace(0, 1, rows)),
        }
    )


@pytest.mark.parametrize("kind", ["parquet", "feather"])
def test_a_table_round_trips_with_its_dtypes(store: WeightStore, tmp_path: Path, kind: str) -> None:
    table = _table()
    path = tmp_path / f"t.{kind}"
    if kind == "parquet":
        pq.write_table(table, path)
    else:
        pyarrow.feather.write_feather(table, path)
    info = import_table(store, path, "tab", test_fraction=0.25, seed=1)
    assert (info.n_train, info.n_test) == (30, 10)
    arrays = info.splits["train"].arrays
    assert (arrays["features"].dtype, arrays["features"].shape) == ("float32", (3,))
    assert arrays["label"].dtype == "int16" and arrays["weight"].dtype == "float64"
    got = {s: read_arrays(store, "tab", s) for s in ("train", "test")}
    weights = np.sort(np.concatenate([got["train"]["weight"], got["test"]["weight"]]))
    np.testing.assert_allclose(weights, np.linspace(0, 1, 40))
    # A row's fields stay together.
    full = table.column("features").combine_chunks().flatten().to_numpy().reshape(40, 3)
    for feats, w in zip(got["test"]["features"], got["test"]["weight"], strict=True):
        np.testing.assert_array_equal(feats, full[round(float(w) * 39)])


def test_a_split_column_gives_the_splits(store: WeightStore, tmp_path: Path) -> None:
    path = tmp_path / "s.parquet"
    table = pa.table(
        {"x": pa.array([1.0, 2.0, 3.0, 4.0]), "split": ["train", "test", "train", "train"]}
    )
    pq.write_table(table, path)
    info = import_table(store, path, "s")
    assert (info.n_train, info.n_test) == (3, 1)
    np.testing.assert_array_equal(read_arrays(store, "s", "test")["x"], [2.0])


@pytest.mark.parametrize(
    ("table", "match"),
    [
        (pa.table({"x": ["a", "b"] * 5}), "column 'x' is string"),
        (pa.table({"x": pa.array([1.0, None] * 5)}), "column 'x' has 5 null"),
        (pa.table({"x": [1, 2], "split": ["train", "validate"]}), "holds \\['validate'\\]"),
        (pa.table({"x": pa.array([[1, 2], [3]])}), "column 'x' is list<"),
    ],
)
def test_bad_tables_are_one_line_and_write_nothing(
    store: WeightStore, tmp_path: Path, table: pa.Table, match: str
) -> None:
    path = tmp_path / "bad.parquet"
    pq.write_table(table, path)
    with pytest.raises(DataError, match=match):
        import_table(store, path, "bad")
    assert list_datasets(store) == []


def test_an_unreadable_table_file_is_one_line(store: WeightStore, tmp_path: Path) -> None:
    path = tmp_path / "junk.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="not a readable Parquet or Arrow file"):
        import_table(store, path, "bad")


# --- what headers claim ----------------------------------------------------------------


@pytest.mark.parametrize(
    "shape",
    [(2**24 + 1, 8), (2**32, 2**32)],
    ids=["just-over", "product-wraps-in-int64"],
)
def test_an_npz_claiming_more_than_the_import_limit_is_refused_unread(
    shape: tuple[int, int], store: WeightStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A header claiming more than the import may hold: refused from the header, nothing allocated.

    The limit is 1 GiB here, and the first shape 64 bytes over it.

    2^32 x 2^32 float64 is 2^67 bytes; numpy's int64 product of the shape is 0.
    """
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f8", "fortran_order": False, "shape": shape}
    )
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x_train.npy", np.lib.format.magic(1, 0) + header.getvalue()[8:])
    monkeypatch.setenv("VCDL_IMPORT_LIMIT", "1GiB")
    assert import_limit() == 2**30
    with pytest.raises(DataError, match=r"decodes to .*, over the import limit of "):
        import_npz(store, path, "huge")
    assert list_datasets(store) == []


# --- bounded reads: what the limits let through still imports whole -------------------


def test_an_npz_is_read_in_chunks_whatever_its_members_names(
    store: WeightStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Members larger than a chunk, a Fortran-ordered one, one named without .npy: all exact."""
    monkeypatch.setattr("vcdl.data.decoded.CHUNK", 1000)
    rng = np.random.default_rng(5)
    x = rng.normal(size=(300, 7)).astype(np.float32)
    y = np.asfortranarray(rng.integers(0, 9, size=(300, 2)).astype(">i8"))
    buf = io.BytesIO()
    np.lib.format.write_array(buf, y)
    path = tmp_path / "chunked.npz"
    np.savez_compressed(path, x=x)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("y", buf.getvalue())  # no .npy suffix: still an array, still checked
    import_npz(store, path, "chunked", test_fraction=0.25)
    got = {s: read_arrays(store, "chunked", s) for s in ("train", "test")}
    assert sorted(got["train"]) == ["x", "y"]
    both = np.concatenate([got["train"]["x"], got["test"]["x"]])
    np.testing.assert_array_equal(np.sort(both, axis=0), np.sort(x, axis=0))
    assert len(got["train"]["y"]) + len(got["test"]["y"]) == 300


def test_the_limits_are_settings_and_a_file_within_them_imports(
    store: WeightStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("vcdl.data.decoded.RATIO_FLOOR", 1 << 20)  # 64 MiB by default
    path = tmp_path / "zeros.npz"
    np.savez_compressed(path, x=np.zeros((2**18, 1)), y=np.zeros(2**18, dtype=np.int8))
    # 2.25 MiB of zeros in a few KB: refused for its ratio, imported when allowed.
    with pytest.raises(DataError, match=r"would decode to 2\.0 MiB, more than 100x"):
        import_npz(store, path, "zeros")
    monkeypatch.setenv("VCDL_IMPORT_LIMIT", "2MiB")
    monkeypatch.setenv("VCDL_IMPORT_RATIO", "0")
    with pytest.raises(DataError, match=r"over the import limit of 2\.0 MiB \(VCDL_IMPORT_LIMIT\)"):
        import_npz(store, path, "zeros")
    monkeypatch.setenv("VCDL_IMPORT_LIMIT", "1GiB")
    info = import_npz(store, path, "zeros")
    assert info.n_train + info.n_test == 2**18
    for bad, match in [("lots", "is not a size"), ("-5", "must be a positive size")]:
        monkeypatch.setenv("VCDL_IMPORT_LIMIT", bad)
        with pytest.raises(DataError, match=match):
            import_npz(store, path, "zeros2")
    monkeypatch.setenv("VCDL_IMPORT_LIMIT", "1GiB")
    monkeypatch.setenv("VCDL_IMPORT_RATIO", "nan")
    with pytest.raises(DataError, match="VCDL_IMPORT_RATIO must be a number >= 0"):
        import_npz(store, path, "zeros2")


@pytest.mark.parametrize("kind", ["stream", "file", "parquet"])
def test_a_compressed_table_with_a_split_column_imports_within_the_limits(
    store: WeightStore, tmp_path: Path, kind: str
) -> None:
    rows = 5000
    table = pa.table(
        {
            "x": pa.array(np.arange(rows, dtype=np.float64)),
            "split": pa.array(["train", "test"] * (rows // 2)),
        }
    )
    path = tmp_path / ("t.parquet" if kind == "parquet" else "t.arrow")
    if kind == "parquet":
        pq.write_table(table, path, compression="zstd")
    else:
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        new = pa.ipc.new_stream if kind == "stream" else pa.ipc.new_file
        with pa.OSFile(str(path), "wb") as sink, new(sink, table.schema, options=options) as w:
            w.write_table(table)
    info = import_table(store, path, "t")
    assert (info.n_train, info.n_test) == (rows // 2, rows // 2)
    np.testing.assert_array_equal(read_arrays(store, "t", "test")["x"], np.arange(1, rows, 2))
