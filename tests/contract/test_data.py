"""Contract of vcdl.data against a store: writing, opening, reading, importing, built-ins."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

import vcdl.data.datasets
from vcdl.data import (
    DatasetInfo,
    import_npz,
    list_datasets,
    make_digits,
    make_mnist1d,
    open_dataset,
    read_arrays,
    read_rows,
    write_dataset,
)
from vcdl.data.cache import SplitCache
from vcdl.errors import DataError
from vcdl.store import WeightStore


@pytest.fixture
def store(tmp_path: Path) -> WeightStore:
    return WeightStore(str(tmp_path / "store"))


def small(
    seed: int = 0, n_train: int = 50, n_test: int = 20, shape: tuple[int, ...] = (3, 4)
) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "x_train": rng.normal(size=(n_train, *shape)).astype(np.float32),
        "y_train": rng.integers(0, 5, size=n_train),
        "x_test": rng.normal(size=(n_test, *shape)).astype(np.float32),
        "y_test": rng.integers(0, 5, size=n_test),
    }


# --- write / open / list -----------------------------------------------------


def test_write_then_open_round_trip(store: WeightStore) -> None:
    arrays = small()
    arrays["y_train"][0] = 4  # make num_classes inference deterministic
    info = write_dataset(store, "toy", **arrays, source="test")
    assert info == open_dataset(store, "toy")
    assert info.n_train == 50 and info.n_test == 20
    assert info.input_shape == (3, 4)
    assert info.num_classes == 5
    assert info.source == "test"
    assert info.fingerprint.startswith("sha256:")
    group = store.open_group("datasets/toy")
    assert group.attrs["complete"] is True
    assert group.attrs["splits"]["train"]["arrays"]["x"] == {"dtype": "float32", "shape": [3, 4]}
    assert group.attrs["hints"] == {"num_classes": 5}
    assert "created_at" in group.attrs
    x_arr, y_arr = group["train/x"], group["test/y"]
    assert isinstance(x_arr, zarr.Array) and isinstance(y_arr, zarr.Array)
    assert x_arr.dtype == np.float32  # as given
    assert y_arr.dtype == np.int64
    x, y = read_rows(store, "toy", "train")
    np.testing.assert_array_equal(x, arrays["x_train"])
    np.testing.assert_array_equal(y, arrays["y_train"])


def test_rows_are_chunked_with_full_sample_extent(store: WeightStore) -> None:
    arrays = small(n_train=20_000, shape=(40,))
    write_dataset(store, "big", **arrays, source="test")
    group = store.open_group("datasets/big")
    arr, labels = group["train/x"], group["train/y"]
    assert isinstance(arr, zarr.Array) and isinstance(labels, zarr.Array)
    rows = arr.chunks[0]
    assert arr.chunks[1:] == (40,)
    # A chunk holds ~2 MiB of a row's arrays together, the same rows in each.
    assert 1 << 20 <= rows * (40 * 4 + 8) <= 4 << 20
    assert labels.chunks == (rows,)
    assert open_dataset(store, "big").splits["train"].rows_per_chunk == rows


def test_list_datasets_skips_incomplete(store: WeightStore) -> None:
    assert list_datasets(store) == []
    write_dataset(store, "b", **small(1), source="test")
    write_dataset(store, "a", **small(2), source="test")
    write_dataset(store, "c", **small(3), source="test")
    store.open_group("datasets/c", mode="a").update_attributes({"complete": False})
    assert [i.name for i in list_datasets(store)] == ["a", "b"]
    assert all(isinstance(i, DatasetInfo) for i in list_datasets(store))


def test_open_missing_gives_advice(store: WeightStore) -> None:
    with pytest.raises(DataError) as info:
        open_dataset(store, "nope")
    msg = str(info.value)
    assert "data set 'nope' not found in store" in msg
    assert store.uri("") in msg
    assert "vcdl data make digits|mnist1d|pytext" in msg
    assert "vcdl data import FILE --name nope" in msg


@pytest.mark.parametrize("complete", [None, False, "yes"])
def test_incomplete_data_set_is_missing(store: WeightStore, complete: Any) -> None:
    write_dataset(store, "half", **small(), source="test")
    group = store.open_group("datasets/half", mode="a")
    if complete is None:
        group.attrs.pop("complete")
    else:
        group.update_attributes({"complete": complete})
    with pytest.raises(DataError, match="vcdl data make"):
        open_dataset(store, "half")
    with pytest.raises(DataError, match="not found"):
        read_rows(store, "half", "train")


def test_missing_array_is_malformed(store: WeightStore) -> None:
    write_dataset(store, "toy", **small(), source="test")
    del store.open_group("datasets/toy", mode="a")["test/y"]
    with pytest.raises(DataError, match="malformed: array 'test/y' is missing"):
        open_dataset(store, "toy")


def test_rewrite_replaces(store: WeightStore) -> None:
    write_dataset(store, "toy", **small(0, n_train=50), source="one")
    info = write_dataset(store, "toy", **small(1, n_train=30), source="two")
    assert open_dataset(store, "toy") == info
    assert read_rows(store, "toy", "train")[0].shape == (30, 3, 4)


def test_fingerprint_tracks_content(store: WeightStore) -> None:
    arrays = small()
    fp = write_dataset(store, "a", **arrays, source="x").fingerprint
    assert write_dataset(store, "b", **arrays, source="y").fingerprint == fp
    # Dtypes are kept, so equal values in other dtypes are other data.
    as64 = {
        k: v.astype(np.float64) if k.startswith("x") else v.astype(np.int32)
        for k, v in arrays.items()
    }
    assert write_dataset(store, "c", **as64, source="z").fingerprint != fp
    changed = {k: v.copy() for k, v in arrays.items()}
    changed["x_test"][3, 1, 2] += 1e-3
    assert write_dataset(store, "d", **changed, source="x").fingerprint != fp
    relabelled = {k: v.copy() for k, v in arrays.items()}
    relabelled["y_train"][0] = (relabelled["y_train"][0] + 1) % 5
    assert write_dataset(store, "e", **relabelled, source="x").fingerprint != fp
    swapped = dict(
        arrays,
        x_train=arrays["x_test"],
        y_train=arrays["y_test"],
        x_test=arrays["x_train"],
        y_test=arrays["y_train"],
    )
    assert write_dataset(store, "f", **swapped, source="x").fingerprint != fp


def _with(**changes: Any) -> dict[str, Any]:
    arrays: dict[str, Any] = small()
    arrays.update(changes)
    return arrays


@pytest.mark.parametrize(
    ("name", "arrays", "kwargs", "match"),
    [
        ("bad/name", small(), {}, "invalid data set name 'bad/name'"),
        ("..", small(), {}, "invalid data set name"),
        ("", small(), {}, "invalid data set name"),
        ("__zarr", small(), {}, "not starting with '__'"),
        (
            "ok",
            _with(y_train=np.zeros(49, dtype=np.int64)),
            {},
            "x_train has 50 rows but y_train has 49",
        ),
        ("ok", _with(y_test=np.full(20, -1)), {}, r"labels must be integers in \[0, 5\)"),
        (
            "ok",
            _with(y_test=np.full(20, 5)),
            {"num_classes": 5},
            r"in \[0, 5\), found values from 0 to 5",
        ),
        ("ok", _with(y_train=np.zeros(50, dtype=np.float32)), {}, "y_train must hold integer"),
        ("ok", _with(y_train=np.zeros((50, 1), dtype=np.int64)), {}, "y_train must be 1-D"),
        ("ok", _with(x_test=np.full((20, 3, 4), np.nan)), {}, "x_test has 240 non-finite"),
        ("ok", _with(x_train=np.full((50, 3, 4), np.inf)), {}, "x_train has 600 non-finite"),
        ("ok", _with(x_train=np.array(["a"] * 50)), {}, "x_train must hold numbers"),
        (
            "ok",
            _with(x_train=np.zeros(50)),
            {},
            r"x_train must have shape \(rows, \*sample_shape\)",
        ),
        (
            "ok",
            _with(x_test=np.zeros((20, 4, 3))),
            {},
            r"x_train samples have shape \(3, 4\) but x_test",
        ),
        (
            "ok",
            _with(x_test=np.zeros((0, 3, 4)), y_test=np.zeros(0, dtype=np.int64)),
            {},
            "the test split is empty",
        ),
        ("ok", small(), {"num_classes": 0}, "num_classes must be >= 1"),
    ],
)
def test_write_validation(
    store: WeightStore, name: str, arrays: dict[str, Any], kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(DataError, match=match):
        write_dataset(store, name, **arrays, source="test", **kwargs)
    assert list_datasets(store) == []


# --- read_rows -----------------------------------------------------------------


def test_read_rows_in_given_order(store: WeightStore) -> None:
    arrays = small(n_train=1000, shape=(5,))
    write_dataset(store, "toy", **arrays, source="test")
    idx = np.array([999, 3, 500, 3, 0, 998, 17])
    x, y = read_rows(store, "toy", "train", idx)
    np.testing.assert_array_equal(x, arrays["x_train"][idx])
    np.testing.assert_array_equal(y, arrays["y_train"][idx])
    assert x.dtype == np.float32 and y.dtype == np.int64
    perm = np.random.default_rng(1).permutation(20)
    xt, yt = read_rows(store, "toy", "test", perm)
    np.testing.assert_array_equal(xt, arrays["x_test"][perm])
    np.testing.assert_array_equal(yt, arrays["y_test"][perm])


@pytest.fixture
def split_cache(monkeypatch: pytest.MonkeyPatch) -> SplitCache:
    cache = SplitCache()
    monkeypatch.setattr(vcdl.data.datasets, "split_cache", cache)
    return cache


def test_cached_rows_equal_stored_rows(store: WeightStore, split_cache: SplitCache) -> None:
    arrays = small(n_train=1000, shape=(5,))
    write_dataset(store, "toy", **arrays, source="test")
    for seed in range(3):
        idx = np.random.default_rng(seed).integers(0, 1000, size=300)  # repeats, any order
        x, y = read_rows(store, "toy", "train", idx, cache_bytes=1 << 20)
        np.testing.assert_array_equal(x, arrays["x_train"][idx])
        np.testing.assert_array_equal(y, arrays["y_train"][idx])
        assert x.dtype == np.float32 and y.dtype == np.int64
        assert x.flags.writeable and y.flags.writeable  # the caller's own copies
    assert len(split_cache._items) == 1  # decoded once, indexed three times
    (kept,) = split_cache._items.values()
    assert not kept["x"].flags.writeable and not kept["y"].flags.writeable


def test_cache_reads_the_split_once(
    store: WeightStore, split_cache: SplitCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_dataset(store, "toy", **small(n_train=1000, shape=(5,)), source="test")
    read_rows(store, "toy", "train", np.arange(10), cache_bytes=1 << 20)
    # Every later shard comes from memory: no chunk read at all.
    monkeypatch.setattr(zarr.Array, "__getitem__", lambda *a: pytest.fail("read the store"))
    monkeypatch.setattr(zarr.Array, "oindex", property(lambda *a: pytest.fail("read the store")))
    x, _ = read_rows(store, "toy", "train", np.array([999, 0]), cache_bytes=1 << 20)
    assert x.shape == (2, 5)


def test_a_split_over_the_budget_is_read_from_the_store(
    store: WeightStore, split_cache: SplitCache
) -> None:
    arrays = small(n_train=1000, shape=(5,))  # 1000 * (5 * 4 + 8) bytes
    write_dataset(store, "toy", **arrays, source="test")
    idx = np.array([5, 1, 5])
    x, _ = read_rows(store, "toy", "train", idx, cache_bytes=27_999)
    np.testing.assert_array_equal(x, arrays["x_train"][idx])
    assert not split_cache._items
    read_rows(store, "toy", "train", idx, cache_bytes=28_000)
    assert len(split_cache._items) == 1
    read_rows(store, "toy", "train", idx)  # no budget: the store, cache untouched
    assert len(split_cache._items) == 1


def test_a_data_set_imported_again_is_not_served_stale(
    store: WeightStore, split_cache: SplitCache
) -> None:
    first, second = small(seed=0, n_train=100), small(seed=1, n_train=100)
    idx = np.arange(100)
    write_dataset(store, "toy", **first, source="test")
    x, _ = read_rows(store, "toy", "train", idx, cache_bytes=1 << 20)
    np.testing.assert_array_equal(x, first["x_train"])
    write_dataset(store, "toy", **second, source="test")  # same name, new content
    x, _ = read_rows(store, "toy", "train", idx, cache_bytes=1 << 20)
    np.testing.assert_array_equal(x, second["x_train"])


def test_the_cache_keeps_the_recently_used_within_its_budget(
    store: WeightStore, split_cache: SplitCache
) -> None:
    for name, seed in (("a", 0), ("b", 1), ("c", 2)):
        write_dataset(store, name, **small(seed=seed, n_train=100, shape=(5,)), source="test")
    budget = 2 * 100 * (5 * 4 + 8)  # two training splits
    idx = np.arange(3)
    for name in ("a", "b", "a", "c"):
        read_rows(store, name, "train", idx, cache_bytes=budget)
    kept = sorted(key[0].rstrip("/").rsplit("/", 1)[-1] for key in split_cache._items)
    assert kept == ["a", "c"]  # b was the least recently used


def test_read_rows_empty_selection(store: WeightStore) -> None:
    write_dataset(store, "toy", **small(), source="test")
    x, y = read_rows(store, "toy", "train", np.array([], dtype=np.int64))
    assert x.shape == (0, 3, 4) and x.dtype == np.float32
    assert y.shape == (0,) and y.dtype == np.int64


@pytest.mark.parametrize(
    ("split", "indices", "match"),
    [
        ("valid", None, "split must be one of"),
        ("train", np.array([0, 50]), r"out of range .* \(50 rows\): found values from 0 to 50"),
        ("test", np.array([-1]), "out of range"),
        ("train", np.array([[0, 1]]), "indices must be 1-D"),
        ("train", np.array([0.0, 1.0]), "indices must be integers"),
    ],
)
def test_read_rows_validation(store: WeightStore, split: str, indices: Any, match: str) -> None:
    write_dataset(store, "toy", **small(), source="test")
    with pytest.raises(DataError, match=match):
        read_rows(store, "toy", split, indices)


# --- import_npz --------------------------------------------------------------


def test_import_npz(store: WeightStore, tmp_path: Path) -> None:
    arrays = small()
    path = tmp_path / "set.npz"
    np.savez(path, **arrays)
    info = import_npz(store, path, "imported")
    assert info == open_dataset(store, "imported")
    assert info.source == f"npz:{path.resolve()}"
    assert info.num_classes == 5  # x and integer y: the classification convention
    np.testing.assert_array_equal(read_rows(store, "imported", "test")[1], arrays["y_test"])


def test_import_npz_of_any_names_keeps_their_dtypes(store: WeightStore, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(30, 2, 2), dtype=np.uint8)
    path = tmp_path / "set.npz"
    np.savez(
        path,
        pixels_train=images[:20],
        pixels_test=images[20:],
        w_train=np.ones(20, np.float16),
        w_test=np.ones(10, np.float16),
    )
    info = import_npz(store, path, "named")
    assert set(info.fields) == {"pixels", "w"} and info.num_classes is None
    got = read_arrays(store, "named", "train", np.array([3, 1]))
    assert got["pixels"].dtype == np.uint8 and got["w"].dtype == np.float16
    np.testing.assert_array_equal(got["pixels"], images[[3, 1]])


def test_import_npz_without_splits_is_split_by_fraction(store: WeightStore, tmp_path: Path) -> None:
    path = tmp_path / "table.npz"
    np.savez(path, features=np.arange(100, dtype=np.float32).reshape(50, 2), target=np.arange(50.0))
    info = import_npz(store, path, "table", test_fraction=0.2)
    assert (info.n_train, info.n_test) == (40, 10)
    train, test = (read_arrays(store, "table", s) for s in ("train", "test"))
    # Every row lands in exactly one split, its fields together.
    both = np.concatenate([train["target"], test["target"]])
    assert sorted(both) == list(np.arange(50.0))
    np.testing.assert_array_equal(train["features"][:, 0] / 2, train["target"])


@pytest.mark.parametrize(
    ("arrays", "match"),
    [
        (
            {"x_train": np.zeros((2, 2)), "y_train": np.zeros(2, dtype=int), "x": np.zeros(1)},
            "some arrays name a split and some do not \\(x\\)",
        ),
        (
            {"x_train": np.zeros((2, 2)), "y_train": np.zeros(2, dtype=int)},
            "no array for the test split; found x_train, y_train",
        ),
        ({"a": np.zeros(3), "b": np.zeros(4)}, "the arrays differ in rows \\(a 3, b 4\\)"),
        ({"a": np.zeros(1)}, "cannot be split into non-empty train and test"),
    ],
)
def test_import_npz_bad_layouts(
    store: WeightStore, tmp_path: Path, arrays: dict[str, Any], match: str
) -> None:
    path = tmp_path / "set.npz"
    np.savez(path, **arrays)
    with pytest.raises(DataError, match=match):
        import_npz(store, path, "bad")
    assert list_datasets(store) == []


def test_a_data_set_written_before_named_arrays_still_reads(store: WeightStore) -> None:
    """Format 1: x_train, y_train, x_test, y_test at the group's top, n_train/n_test attributes."""
    arrays = small()
    group = store.open_group("datasets/old", mode="w")
    for key, a in arrays.items():
        group.create_array(key, data=np.asarray(a, dtype=np.float32 if key[0] == "x" else np.int64))
    group.update_attributes(
        {"name": "old", "num_classes": 5, "input_shape": [3, 4], "source": "v0.1",
         "fingerprint": "sha256:abc", "n_train": 50, "n_test": 20, "complete": True}
    )  # fmt: skip
    info = open_dataset(store, "old")
    assert (info.n_train, info.n_test, info.input_shape, info.num_classes) == (50, 20, (3, 4), 5)
    assert info.fingerprint == "sha256:abc" and info.format == 1
    x, y = read_rows(store, "old", "train", np.array([4, 2]))
    np.testing.assert_array_equal(x, arrays["x_train"][[4, 2]])
    np.testing.assert_array_equal(y, arrays["y_train"][[4, 2]])


@pytest.mark.parametrize("content", [b"", b"not an npz at all", b"PK\x03\x04broken zip"])
def test_import_npz_unreadable(store: WeightStore, tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.npz"
    path.write_bytes(content)
    with pytest.raises(DataError, match=r"cannot import .*bad\.npz"):
        import_npz(store, path, "bad")


def test_import_npz_missing_file(store: WeightStore, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="file not found"):
        import_npz(store, tmp_path / "absent.npz", "bad")


def test_import_single_npy_rejected(store: WeightStore, tmp_path: Path) -> None:
    path = tmp_path / "one.npy"
    np.save(path, np.zeros(3))
    with pytest.raises(DataError, match=r"not an \.npz archive"):
        import_npz(store, path, "bad")


def test_import_npz_refuses_pickled_objects(store: WeightStore, tmp_path: Path) -> None:
    arrays: dict[str, Any] = small()
    arrays["x_train"] = np.array([object()] * 50, dtype=object)
    path = tmp_path / "pickled.npz"
    np.savez(path, **arrays)
    with pytest.raises(DataError, match="'x_train' cannot be loaded without pickle"):
        import_npz(store, path, "bad")
    assert list_datasets(store) == []


# --- built-in sets -------------------------------------------------------------


def test_make_digits(store: WeightStore) -> None:
    info = make_digits(store, size=16, test_fraction=0.25, seed=3)
    assert info.name == "digits"
    assert info.input_shape == (1, 16, 16)
    assert info.num_classes == 10
    assert info.n_train + info.n_test == 1797
    assert info.n_test == 450
    x, y = read_rows(store, "digits", "train")
    assert x.min() == 0.0 and x.max() == 1.0
    # Nearest-neighbour upsampling: every 2x2 block is one original pixel.
    np.testing.assert_array_equal(x[:, :, ::2, ::2], x[:, :, 1::2, 1::2])
    # Stratified: every class in both splits.
    assert set(y) == set(read_rows(store, "digits", "test")[1]) == set(range(10))
    assert make_digits(store, name="again", size=16, test_fraction=0.25, seed=3).fingerprint == (
        info.fingerprint
    )
    assert make_digits(store, name="other", size=16, test_fraction=0.25, seed=4).fingerprint != (
        info.fingerprint
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"size": 12}, "multiple of 8"), ({"test_fraction": 1.0}, "test_fraction")],
)
def test_make_digits_validation(store: WeightStore, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(DataError, match=match):
        make_digits(store, **kwargs)


def test_make_mnist1d_offline_and_side_effect_free(
    store: WeightStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import random

    import requests

    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("mnist1d tried to download")

    monkeypatch.setattr(requests, "get", no_network)
    monkeypatch.chdir(tmp_path)  # get_dataset would write ./mnist1d_data.pkl here
    np.random.seed(7)
    random.seed(7)
    expected_np, expected_py = np.random.rand(), random.random()
    np.random.seed(7)
    random.seed(7)

    info = make_mnist1d(store, samples=2000, seed=5)

    assert (np.random.rand(), random.random()) == (expected_np, expected_py)
    assert list(tmp_path.iterdir()) == [tmp_path / "store"]
    assert info.input_shape == (40,)
    assert (info.n_train, info.n_test, info.num_classes) == (1600, 400, 10)
    x, y = read_rows(store, "mnist1d", "test")
    assert x.shape == (400, 40) and x.dtype == np.float32
    assert set(y) <= set(range(10))
    again = make_mnist1d(store, name="mnist1d-again", samples=2000, seed=5)
    assert again.fingerprint == info.fingerprint


def test_make_mnist1d_writes_nothing_in_home(tmp_path: Path) -> None:
    """mnist1d imports matplotlib, whose font cache must not land in ~/.cache."""
    import subprocess
    import sys

    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MPL", "XDG_"))}
    env["HOME"] = str(home)
    code = (
        "import sys\n"
        "from vcdl.data import make_mnist1d\n"
        "from vcdl.store import WeightStore\n"
        "assert 'matplotlib' not in sys.modules\n"
        f"make_mnist1d(WeightStore({str(tmp_path / 'store')!r}), samples=100)\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, check=True, timeout=120)
    assert list(home.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "store"]


def test_processes_that_never_reach_exit_leave_one_matplotlib_dir(tmp_path: Path) -> None:
    """Killed workers and ``os._exit`` skip atexit: the cache dir must not pile up."""
    import subprocess
    import sys

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MPL", "XDG_"))}
    env["TMPDIR"] = str(tmp)
    code = (
        "import os\n"
        "from vcdl.data import make_mnist1d\n"
        "from vcdl.store import WeightStore\n"
        f"make_mnist1d(WeightStore({str(tmp_path / 'store')!r}), samples=100)\n"
        "os._exit(0)\n"  # as a Dask worker ends: no atexit
    )
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    assert [p.name for p in tmp.iterdir()] == [f"vcdl-matplotlib-{os.getuid()}"]
