"""A Parquet file read within the import's memory ceiling, whatever its metadata claims.

A Parquet file states its sizes twice: in its footer (row counts, each
column chunk's sizes) and in a header before every page (the page's
decompressed size and value count). Arrow sizes what it reads by the page
headers and stops by the footer's row counts, and nothing makes the two
agree: a footer of 1,000 rows can sit over a page that decompresses to
1 GiB, which Arrow allocates and fills whole before it reads the 1,000 rows.
So :func:`read_parquet` checks three times, each refusal one
:class:`~vcdl.errors.DataError` line (the CLI's exit 2):

1. the footer (:func:`vcdl.data.decoded.parquet_decoded_bytes`);
2. every page header of every column chunk, read from the file with a small
   Thrift reader of its own (:func:`page_decoded_bytes`): no page is
   decompressed;
3. while reading: batch by batch, the decoded bytes so far are checked
   against the ceiling after each batch, so a file that decodes to more than
   both claims stops one batch past the limit, not at the end.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO

from vcdl.data.decoded import parquet_decoded_bytes, refuse_over_limit, row_width

__all__ = ["BATCH_BYTES", "page_decoded_bytes", "read_parquet"]

BATCH_BYTES = 32 << 20
"""About how many decoded bytes a batch of the bounded read holds."""

MAX_HEADER = 16 << 20
"""The largest page header read (Arrow's own default limit)."""

_MAX_DEPTH = 32
"""Nesting of Thrift structs and lists a page header may have."""

# Thrift compact protocol types.
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY = 1, 2, 3, 4, 5, 6, 7, 8
_LIST, _SET, _MAP, _STRUCT = 9, 10, 11, 12

# Parquet's PageHeader: its page types and the fields read here.
_DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 2, 3
_TYPE, _UNCOMPRESSED, _COMPRESSED = 1, 2, 3
_DATA_HEADER, _DICTIONARY_HEADER, _DATA_HEADER_V2 = 5, 7, 8


class _Short(Exception):
    """The header runs past the bytes read so far (read more and parse again)."""


class _Compact:
    """Just enough of Thrift's compact protocol to read a Parquet page header."""

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def _byte(self) -> int:
        if self.pos >= len(self.buf):
            raise _Short
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def _varint(self) -> int:
        value = shift = 0
        while True:
            b = self._byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ValueError("a Thrift varint longer than 64 bits")

    def _int(self) -> int:
        n = self._varint()
        return (n >> 1) ^ -(n & 1)

    def _skip_bytes(self, n: int) -> None:
        if n < 0:
            raise ValueError("a negative Thrift length")
        if self.pos + n > len(self.buf):
            raise _Short
        self.pos += n

    def _skip(self, kind: int, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise ValueError(f"a page header nested more than {_MAX_DEPTH} deep")
        if kind in (_TRUE, _FALSE):
            return
        if kind == _BYTE:
            self._skip_bytes(1)
        elif kind in (_I16, _I32, _I64):
            self._varint()
        elif kind == _DOUBLE:
            self._skip_bytes(8)
        elif kind == _BINARY:
            self._skip_bytes(self._varint())
        elif kind in (_LIST, _SET):
            head = self._byte()
            size = head >> 4 if head >> 4 != 15 else self._varint()
            for _ in range(size):
                # A boolean in a list is a byte of its own.
                self._skip(_BYTE if head & 0x0F in (_TRUE, _FALSE) else head & 0x0F, depth + 1)
        elif kind == _MAP:
            size = self._varint()
            if size:
                types = self._byte()
                for _ in range(size):
                    self._skip(types >> 4, depth + 1)
                    self._skip(types & 0x0F, depth + 1)
        elif kind == _STRUCT:
            self.fields(depth + 1)
        else:
            raise ValueError(f"a page header holds Thrift type {kind}, which does not exist")

    def fields(self, depth: int = 0, want: frozenset[int] = frozenset()) -> dict[int, Any]:
        """A struct's fields: the integers and structs among ``want`` (by field id) kept."""
        found: dict[int, Any] = {}
        last = 0
        while True:
            head = self._byte()
            if head == 0:
                return found
            kind, delta = head & 0x0F, head >> 4
            fid = last + delta if delta else self._int()
            last = fid
            if fid in want and kind in (_I16, _I32, _I64):
                found[fid] = self._int()
            elif fid in want and kind == _STRUCT:
                found[fid] = self.fields(depth + 1, frozenset({1}))
            else:
                self._skip(kind, depth)


_WANT = frozenset(
    {_TYPE, _UNCOMPRESSED, _COMPRESSED, _DATA_HEADER, _DICTIONARY_HEADER, _DATA_HEADER_V2}
)


def _page_header(f: BinaryIO, pos: int, end: int) -> tuple[dict[int, Any], int]:
    """(the header's fields, its length in bytes) of the page at ``pos``."""
    window = 256
    while True:
        f.seek(pos)
        buf = f.read(min(window, end - pos))
        reader = _Compact(buf)
        try:
            return reader.fields(want=_WANT), reader.pos
        except _Short:
            if len(buf) < window or window >= MAX_HEADER:
                raise ValueError(
                    f"a page header at byte {pos} runs past its column chunk or past "
                    f"{MAX_HEADER >> 20} MiB"
                ) from None
            window *= 4


def _chunk_pages(f: BinaryIO, column: Any, width: int, file_size: int) -> int:
    """The decoded bytes a column chunk's page headers claim.

    Every page in the bytes Arrow reads for the chunk (from its first page,
    for its stated compressed length) counts, whether or not the footer's
    value count would stop Arrow before it: its decompressed size, and for a
    data page its values at the leaf's width too (dictionary and run-length
    encoded values decode to far more than their page).
    """
    start = column.data_page_offset
    if column.has_dictionary_page and (column.dictionary_page_offset or 0) > 0:
        start = min(start, column.dictionary_page_offset)
    end = min(start + max(column.total_compressed_size, 0), file_size)
    if start < 0:
        raise ValueError(f"a column chunk starts at byte {start}")
    total = 0
    pos = start
    while pos < end:
        header, length = _page_header(f, pos, end)
        size, stored = header.get(_UNCOMPRESSED, 0), header.get(_COMPRESSED, -1)
        if size < 0 or stored < 0:
            raise ValueError(f"a page at byte {pos} states no size or a negative one")
        total += size
        kind = header.get(_TYPE)
        data = header.get(_DATA_HEADER if kind == _DATA_PAGE else _DATA_HEADER_V2)
        if kind in (_DATA_PAGE, _DATA_PAGE_V2) and data is not None:
            total += max(int(data.get(1, 0)), 0) * width
        pos += length + stored
    return total


def _leaf_width(kind: Any) -> int:
    """Bytes of one value of a column's leaf (a fixed-size list's pages hold its values)."""
    import pyarrow as pa

    while pa.types.is_fixed_size_list(kind):
        kind = kind.value_type
    return row_width(kind)


def page_decoded_bytes(path: Path, meta: Any, schema: Any) -> int:
    """The bytes a Parquet file decodes to by its page headers; no page is decompressed.

    ``meta`` is the file's ``pyarrow.parquet.FileMetaData``, ``schema`` its
    Arrow schema. Raises ``ValueError`` for a header that cannot be read.
    """
    # A label a row for 'split', as the footer's count has it. Every column an import
    # takes is one leaf, in the schema's order: the j-th column chunk is the j-th field.
    widths = [8 if field.name == "split" else _leaf_width(field.type) for field in schema]
    file_size = path.stat().st_size
    total = 0
    with open(path, "rb") as f:
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            for j in range(group.num_columns):
                width = widths[j] if group.num_columns == len(widths) else max(widths, default=8)
                total += _chunk_pages(f, group.column(j), width, file_size)
    return total


def _textual(kind: Any) -> bool:
    import pyarrow as pa

    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    )


def read_parquet(p: Path, check_schema: Any) -> Any:
    """The file as a ``pyarrow.Table``: footer, page headers, then batches, each checked.

    ``check_schema(schema, where)`` refuses columns an import cannot take,
    before any page is read.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    where, size = str(p), os.stat(p).st_size
    meta = pq.read_metadata(p)
    schema = meta.schema.to_arrow_schema()
    check_schema(schema, where)
    refuse_over_limit(where, parquet_decoded_bytes(meta, schema), size)
    refuse_over_limit(f"{where} (by its page headers)", page_decoded_bytes(p, meta, schema), size)
    split = schema.field("split").type if "split" in schema.names else None
    # A string 'split' column stays dictionary-encoded: a few labels, not one string a row.
    textual = split is not None and _textual(split)
    per_row = max(sum(row_width(field.type) for field in schema), 1)
    batches, decoded = [], 0
    with pq.ParquetFile(p, read_dictionary=["split"] if textual else None) as reader:
        for batch in reader.iter_batches(batch_size=max(BATCH_BYTES // per_row, 1)):
            decoded += batch.nbytes
            refuse_over_limit(f"{where} (read so far)", decoded, size)
            batches.append(batch)
        if not batches:
            return reader.schema_arrow.empty_table()
    return pa.Table.from_batches(batches)
