"""Issue 54: a Parquet file whose footer understates what its pages decode to is refused.

The footer's pre-check reads row counts and column sizes; the page headers
can claim far more, and Arrow allocates what a page header says. Here: a
crafted file (tests/parquetcraft.py) whose footer says 1,000 rows over a page
of 1 GiB, refused by its page headers whatever the ratio setting; honest
files, whose page headers agree with their footer, are not refused by them;
and the bounded read stops one batch past the ceiling when both claims are
wrong.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import vcdl.data.parquet_read as parquet_read
from vcdl.data.decoded import parquet_decoded_bytes
from vcdl.data.importers import import_table
from vcdl.errors import DataError
from vcdl.store import WeightStore

from ..parquetcraft import lying_parquet

GIB = 1 << 30


@pytest.fixture(scope="module")
def page_bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("craft") / "bomb.parquet"
    lying_parquet(path, page_bytes=GIB)
    return path


def test_the_crafted_file_is_what_it_claims_to_be(page_bomb: Path) -> None:
    """Its footer passes the footer's check: only the page headers give it away."""
    meta = pq.read_metadata(page_bomb)
    schema = meta.schema.to_arrow_schema()
    assert meta.num_rows == 1000 and page_bomb.stat().st_size < 64 << 10
    assert parquet_decoded_bytes(meta, schema) < 64 << 10
    assert parquet_read.page_decoded_bytes(page_bomb, meta, schema) >= 2 * GIB


def test_a_page_bomb_is_refused_by_its_page_headers(page_bomb: Path, tmp_path: Path) -> None:
    store = WeightStore(str(tmp_path / "store"))
    with pytest.raises(DataError, match=r"\(by its page headers\): .* would decode to 2\.0 GiB"):
        import_table(store, page_bomb, "x")
    assert not (tmp_path / "store" / "datasets" / "x").exists()


def test_without_the_ratio_check_the_ceiling_refuses_it(
    page_bomb: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VCDL_IMPORT_RATIO", "0")
    monkeypatch.setenv("VCDL_IMPORT_LIMIT", "256MiB")
    store = WeightStore(str(tmp_path / "store"))
    with pytest.raises(DataError, match=r"page headers\): it decodes to 2\.0 GiB, over the"):
        import_table(store, page_bomb, "x")


def _honest(path: Path, rows: int, **options: object) -> pa.Table:
    rng = np.random.default_rng(54)
    table = pa.table(
        {
            "x": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.standard_normal(rows * 6).astype(np.float32)), 6
            ),
            "y": pa.array(rng.integers(0, 10, rows)),
            "w": pa.array(np.zeros(rows, dtype=np.float64)),  # run-length and dictionary pages
            "flag": pa.array(rng.integers(0, 2, rows).astype(bool)),
            "split": pa.array(np.where(np.arange(rows) % 5 == 0, "test", "train")),
        }
    )
    pq.write_table(table, path, **options)  # type: ignore[arg-type]
    return table


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"compression": "zstd", "row_group_size": 1000, "data_page_size": 4096},
        {"use_dictionary": False, "compression": "none"},
        {"data_page_version": "2.0", "compression": "gzip"},
    ],
    ids=["default", "many-pages", "plain", "page-v2"],
)
def test_an_honest_file_claims_in_its_pages_what_its_footer_says(
    options: dict[str, object], tmp_path: Path
) -> None:
    path = tmp_path / "honest.parquet"
    table = _honest(path, 20_000, **options)
    meta = pq.read_metadata(path)
    schema = meta.schema.to_arrow_schema()
    footer = parquet_decoded_bytes(meta, schema)
    pages = parquet_read.page_decoded_bytes(path, meta, schema)
    assert table.nbytes <= pages <= footer * 1.05, (table.nbytes, pages, footer)
    store = WeightStore(str(tmp_path / "store"))
    info = import_table(store, path, "honest")
    assert (info.n_train, info.n_test) == (16_000, 4_000)


def test_the_read_stops_one_batch_past_the_ceiling_when_every_claim_is_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Footer and page headers both said to claim nothing: the bounded read alone stops it."""
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"x": np.arange(2_000_000, dtype=np.int64)}), path)  # 16 MB
    monkeypatch.setattr(parquet_read, "parquet_decoded_bytes", lambda *_: 0)
    monkeypatch.setattr(parquet_read, "page_decoded_bytes", lambda *_: 0)
    monkeypatch.setattr(parquet_read, "BATCH_BYTES", 1 << 20)
    monkeypatch.setenv("VCDL_IMPORT_LIMIT", "4MiB")
    read: list[int] = []
    iter_batches = pq.ParquetFile.iter_batches

    def counted(self: pq.ParquetFile, **kwargs: object) -> object:
        for batch in iter_batches(self, **kwargs):  # type: ignore[arg-type]
            read.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counted)
    store = WeightStore(str(tmp_path / "store"))
    with pytest.raises(DataError, match=r"\(read so far\): it decodes to 4\.\d MiB, over the"):
        import_table(store, path, "big")
    assert sum(read) * 8 <= (4 << 20) + (1 << 20), read  # one batch past 4 MiB, not 16 MB


def test_a_page_header_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "cut.parquet"
    _honest(path, 1000)
    meta = pq.read_metadata(path)
    first = meta.row_group(0).column(0)
    start = first.dictionary_page_offset or first.data_page_offset
    data = bytearray(path.read_bytes())
    data[start : start + 40] = b"\x1c" * 40  # a struct in a struct, 40 deep
    path.write_bytes(bytes(data))
    store = WeightStore(str(tmp_path / "store"))
    with pytest.raises(DataError) as caught:
        import_table(store, path, "cut")
    assert str(caught.value) == (
        f"cannot import {path}: not a readable Parquet or Arrow file (a page header nested "
        "more than 32 deep)"
    )


def test_a_dotted_column_name_counts_at_its_width(tmp_path: Path) -> None:
    """A column chunk's path is dotted ('a.b'); its width is its field's, by position."""
    path = tmp_path / "dotted.parquet"
    table = pa.table({"a.b": np.zeros(50_000), "y": np.arange(50_000)})
    pq.write_table(table, path)
    meta = pq.read_metadata(path)
    pages = parquet_read.page_decoded_bytes(path, meta, meta.schema.to_arrow_schema())
    assert pages >= table.nbytes
