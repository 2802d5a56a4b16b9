"""Parquet files written byte by byte, whose footer and page headers need not agree.

pyarrow writes only honest files; a hostile one (issue 54) has a footer that
states 1,000 rows and a page that decompresses to 1 GiB. :func:`lying_parquet`
writes such a file of one required int64 column ``x``: a Thrift compact
encoder of its own for the footer and the page header, the page's zeros
compressed with zstd as repeated 16-MiB frames (1 GiB in about 34 KB, in a
fraction of a second).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pyarrow as pa

__all__ = ["lying_parquet"]

_I32, _I64, _BINARY, _LIST, _STRUCT = 5, 6, 8, 9, 12
_FRAME = 16 << 20


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        if not n:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def _zigzag(n: int) -> bytes:
    return _varint((n << 1) ^ (n >> 63))


class _Struct:
    """A Thrift compact-protocol struct, written field by field in increasing id order."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.last = 0

    def _head(self, fid: int, kind: int) -> None:
        delta = fid - self.last
        if 0 < delta <= 15:
            self.buf.append(delta << 4 | kind)
        else:
            self.buf.append(kind)
            self.buf += _zigzag(fid)
        self.last = fid

    def i32(self, fid: int, value: int) -> _Struct:
        self._head(fid, _I32)
        self.buf += _zigzag(value)
        return self

    def i64(self, fid: int, value: int) -> _Struct:
        self._head(fid, _I64)
        self.buf += _zigzag(value)
        return self

    def binary(self, fid: int, value: bytes) -> _Struct:
        self._head(fid, _BINARY)
        self.buf += _varint(len(value)) + value
        return self

    def struct(self, fid: int, value: _Struct) -> _Struct:
        self._head(fid, _STRUCT)
        self.buf += value.end()
        return self

    def items(
        self, fid: int, kind: int, values: list[int] | list[bytes] | list[_Struct]
    ) -> _Struct:
        self._head(fid, _LIST)
        assert len(values) < 15
        self.buf.append(len(values) << 4 | kind)
        for v in values:
            if isinstance(v, _Struct):
                self.buf += v.end()
            elif isinstance(v, bytes):
                self.buf += _varint(len(v)) + v
            else:
                self.buf += _zigzag(v)
        return self

    def end(self) -> bytes:
        return bytes(self.buf) + b"\0"


def _zstd_zeros(n: int) -> bytes:
    """``n`` zero bytes (a multiple of 16 MiB) as concatenated zstd frames."""
    assert n % _FRAME == 0, n
    frame = pa.compress(bytes(_FRAME), codec="zstd", asbytes=True)
    return bytes(frame) * (n // _FRAME)


def lying_parquet(path: Path, *, page_bytes: int, rows: int = 1000) -> None:
    """A Parquet file whose footer says ``rows`` int64 rows (``8 * rows`` bytes) and whose one
    data page decompresses to ``page_bytes`` of zeros (a multiple of 16 MiB), values to match."""
    body = _zstd_zeros(page_bytes)
    # PageHeader: DATA_PAGE, sizes, DataPageHeader(num_values, PLAIN, RLE, RLE).
    values = _Struct().i32(1, page_bytes // 8).i32(2, 0).i32(3, 3).i32(4, 3)
    page = _Struct().i32(1, 0).i32(2, page_bytes).i32(3, len(body)).struct(5, values).end()
    chunk, start = page + body, 4
    # ColumnMetaData: INT64, [PLAIN], ["x"], ZSTD, values, sizes (understated), first page.
    column = (
        _Struct()
        .i32(1, 2)
        .items(2, _I32, [0])
        .items(3, _BINARY, [b"x"])
        .i32(4, 6)
        .i64(5, rows)
        .i64(6, 8 * rows)
        .i64(7, len(chunk))
        .i64(9, start)
    )
    group = (
        _Struct()
        .items(1, _STRUCT, [_Struct().i64(2, start).struct(3, column)])
        .i64(2, 8 * rows)
        .i64(3, rows)
    )
    schema = [
        _Struct().binary(4, b"schema").i32(5, 1),
        _Struct().i32(1, 2).i32(3, 0).binary(4, b"x"),  # INT64, REQUIRED
    ]
    footer = _Struct().i32(1, 1).items(2, _STRUCT, schema).i64(3, rows)
    footer = footer.items(4, _STRUCT, [group])
    meta = footer.end()
    path.write_bytes(b"PAR1" + chunk + meta + struct.pack("<I", len(meta)) + b"PAR1")
