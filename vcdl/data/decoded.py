"""What an input file will decode to, read from its metadata before anything is decoded.

The importers' pre-checks (:mod:`vcdl.data.importers`) and their bounded reads:

* :func:`npz_members`: every member of an ``.npz`` archive, whatever its
  name, as the ``.npy`` header it starts with (shape, dtype, bytes), after
  the zip's own sizes and ratios are checked; :func:`read_npy_member` then
  reads one member into an array of exactly that size, chunk by chunk.
* :func:`ipc_decoded_bytes`: the bytes an Arrow IPC file or stream decodes
  to, from its messages' buffer lengths (a compressed buffer states its
  decoded length in its first 8 bytes).
* :func:`parquet_decoded_bytes`: the bytes a Parquet file's numeric columns
  decode to, from its row counts and schema, not from its encoded sizes
  (dictionary and run-length encoding make a few KB into GiBs).
* :func:`refuse_over_limit`: the memory ceiling of an import
  (:func:`import_limit`, a third of the machine's available memory) and the
  ratio a file may expand by (:func:`ratio_limit`).
"""

from __future__ import annotations

import math
import os
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vcdl.errors import DataError

IMPORT_LIMIT_ENV = "VCDL_IMPORT_LIMIT"
"""A size (``8GiB``, ``500MB``) that replaces the default memory ceiling of an import."""

IMPORT_RATIO_ENV = "VCDL_IMPORT_RATIO"
"""The most a file, or a zip member, may expand by when decoded; ``0``: no check."""

DEFAULT_RATIO = 100
"""Real data compresses 2-10x; a zip bomb of zeros 1000x, a Parquet run of one value more."""

RATIO_FLOOR = 64 << 20
"""Data decoding to at most this much is never refused for its ratio."""

CHUNK = 16 << 20
"""Bytes an importer reads at a time."""

MAX_MEMBERS = 10_000
"""Members an ``.npz`` may hold (each is read for its header)."""


def memory_bytes() -> int:
    """This machine's physical memory (bytes); a large number where it cannot be read."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def available_memory() -> int:
    """Memory the kernel could give a new allocation now (``MemAvailable``), else physical."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return memory_bytes()


def import_limit() -> int:
    """The most an import may decode: ``$VCDL_IMPORT_LIMIT``, else a third of available memory.

    A third, because an import holds its data up to three times at its
    peak (decoded, converted, split).
    """
    raw = os.environ.get(IMPORT_LIMIT_ENV, "").strip()
    if raw:
        from dask.utils import parse_bytes

        try:
            limit = int(parse_bytes(raw))
        except (ValueError, TypeError):
            raise DataError(
                f"{IMPORT_LIMIT_ENV}={raw[:40]!r} is not a size; give one like 8GiB or 500MB"
            ) from None
        if limit <= 0:
            raise DataError(f"{IMPORT_LIMIT_ENV} must be a positive size, got {raw[:40]!r}")
        return limit
    return available_memory() // 3


def ratio_limit() -> float:
    """``$VCDL_IMPORT_RATIO``, else :data:`DEFAULT_RATIO`; 0 turns the check off."""
    raw = os.environ.get(IMPORT_RATIO_ENV, "").strip()
    if not raw:
        return DEFAULT_RATIO
    try:
        ratio = float(raw)
    except ValueError:
        ratio = -1.0
    if not (ratio >= 0 and math.isfinite(ratio)):
        raise DataError(f"{IMPORT_RATIO_ENV} must be a number >= 0, got {raw[:40]!r}")
    return ratio


def _size(n: int) -> str:
    for unit, shift in (("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def refuse_over_limit(what: str, decoded: int, encoded: int | None = None) -> None:
    """Refuse an input that decodes past the memory ceiling, or expands past the ratio limit."""
    limit = import_limit()
    if decoded > limit:
        how = (
            f"{IMPORT_LIMIT_ENV}"
            if os.environ.get(IMPORT_LIMIT_ENV, "").strip()
            else f"a third of this machine's available memory; {IMPORT_LIMIT_ENV} sets it"
        )
        raise DataError(
            f"cannot import {what}: it decodes to {_size(decoded)}, over the import limit of "
            f"{_size(limit)} ({how}); import it in parts"
        )
    ratio = ratio_limit()
    if (
        encoded is not None
        and ratio
        and decoded > RATIO_FLOOR
        and decoded > ratio * max(encoded, 1)
    ):
        raise DataError(
            f"cannot import {what}: {_size(encoded)} would decode to {_size(decoded)}, more than "
            f"{ratio:g}x (a decompression bomb?); if the data is real, store it uncompressed "
            f"or set {IMPORT_RATIO_ENV}"
        )


def unreadable_path(p: Path, exc: OSError) -> DataError:
    """The error for a path the system refuses to look at (too long, no permission, a loop)."""
    shown = str(p) if len(str(p)) <= 200 else f"{str(p)[:97]}...{str(p)[-100:]}"
    return DataError(f"cannot import {shown}: {exc.strerror or exc}; give a path you can read")


def regular_file(p: Path) -> None:
    """Refuse a path that is not a regular file (missing, a folder, a FIFO, a device)."""
    try:
        # is_file() raises for a name too long or a folder it may not enter.
        if p.is_file():
            return
        exists = p.exists()
    except OSError as exc:
        raise unreadable_path(p, exc) from None
    if not exists:
        raise DataError(f"cannot import {p}: file not found")
    raise DataError(
        f"cannot import {p}: not a regular file (a folder, FIFO or device cannot be imported "
        "this way); give a file"
    )


# --------------------------------------------------------------------------
# .npz: zip members and .npy headers
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class NpyMember:
    """One array of an ``.npz``: its zip member, its key, and what its header claims."""

    member: str
    key: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    fortran_order: bool
    nbytes: int


def _read_header(f: Any, where: str, name: str) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    try:
        version = np.lib.format.read_magic(f)
    except ValueError:
        raise DataError(
            f"cannot import {where}: member {name[:100]!r} is not a NumPy array (.npy); an "
            ".npz holds arrays only (np.savez)"
        ) from None
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise DataError(
            f"cannot import {where}: member {name[:100]!r} is .npy version {version}; save it "
            "with np.savez (version 1.0 or 2.0)"
        )
    return tuple(int(n) for n in shape), bool(fortran), dtype


def npz_members(archive: zipfile.ZipFile, where: str) -> list[NpyMember]:
    """Every member's ``.npy`` header, checked; nothing but the headers is decoded.

    Refused: duplicate names (``x`` and ``x.npy`` are one key), a member that
    is not an ``.npy`` array whatever its name, object (pickled) and 0-d
    arrays, a header claiming more than its member holds, a member that
    expands past the ratio limit, and archives decoding past the import limit.
    """
    infos = archive.infolist()
    if len(infos) > MAX_MEMBERS:
        raise DataError(
            f"cannot import {where}: the archive has {len(infos)} members, more than "
            f"{MAX_MEMBERS}; save fewer, larger arrays"
        )
    keys: set[str] = set()
    for info in infos:
        key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
        if key in keys:
            raise DataError(
                f"cannot import {where}: the archive holds two members named {key[:100]!r}; "
                "save each array once"
            )
        keys.add(key)
        refuse_over_limit(f"{where} (member {key[:100]!r})", info.file_size, info.compress_size)
    refuse_over_limit(where, sum(i.file_size for i in infos))
    members = []
    for info in infos:
        key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
        with archive.open(info) as f:
            shape, fortran, dtype = _read_header(f, where, info.filename)
            header_bytes = f.tell()
        if dtype.hasobject:
            # Object arrays need pickle, which could run code: refuse.
            raise DataError(
                f"cannot import {where}: array {key[:100]!r} cannot be loaded without pickle "
                "(it holds Python objects); save plain numeric arrays"
            )
        if not shape:
            raise DataError(
                f"cannot import {where}: array {key[:100]!r} is 0-d (a single value); every "
                "array needs rows (a first dimension)"
            )
        # Python's integers: numpy's int64 product wraps (2^32 x 2^32 would read as 0).
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > info.file_size - header_bytes:
            refuse_over_limit(where, nbytes)
            raise DataError(
                f"cannot import {where}: array {key[:100]!r} claims {_size(nbytes)} but its "
                f"member holds {_size(max(info.file_size - header_bytes, 0))}; the archive is "
                "damaged"
            )
        members.append(NpyMember(info.filename, key, shape, dtype, fortran, nbytes))
    return members


def read_npy_member(archive: zipfile.ZipFile, m: NpyMember, where: str) -> np.ndarray:
    """The member's array, read in :data:`CHUNK` pieces into memory of its header's size."""
    count = math.prod(m.shape)
    flat = np.empty(count, dtype=m.dtype)
    with archive.open(m.member) as f:
        _read_header(f, where, m.member)
        raw = flat.view(np.uint8) if m.nbytes else np.empty(0, np.uint8)
        pos = 0
        while pos < m.nbytes:
            piece = f.read(min(CHUNK, m.nbytes - pos))
            if not piece:
                raise DataError(
                    f"cannot import {where}: array {m.key[:100]!r} ends after {pos} of its "
                    f"{m.nbytes} bytes; the archive is damaged"
                )
            raw[pos : pos + len(piece)] = np.frombuffer(piece, dtype=np.uint8)
            pos += len(piece)
    return flat.reshape(m.shape, order="F" if m.fortran_order else "C")


# --------------------------------------------------------------------------
# Arrow IPC: buffer lengths from the messages' flatbuffers
# --------------------------------------------------------------------------


def _u32(buf: bytes, pos: int) -> int:
    return int(struct.unpack_from("<I", buf, pos)[0])


def _field(buf: bytes, table: int, index: int) -> int | None:
    """The position of a flatbuffer table's field ``index``; None where it is absent."""
    vtable = table - int(struct.unpack_from("<i", buf, table)[0])
    vt_len = int(struct.unpack_from("<H", buf, vtable)[0])
    slot = 4 + 2 * index
    if slot + 2 > vt_len:
        return None
    off = int(struct.unpack_from("<H", buf, vtable + slot)[0])
    return table + off if off else None


def _ref(buf: bytes, pos: int) -> int:
    return pos + _u32(buf, pos)


_RECORD_BATCH, _DICTIONARY_BATCH = 3, 2


def _batch_decoded(meta: bytes, body: Any) -> tuple[int, int]:
    """(rows, decoded bytes) of one message; (0, 0) for a schema or other message."""
    root = _u32(meta, 0)
    kind = _field(meta, root, 1)
    header = _field(meta, root, 2)
    if kind is None or header is None:
        return 0, 0
    batch = _ref(meta, header)
    if meta[kind] == _DICTIONARY_BATCH:
        data = _field(meta, batch, 1)
        if data is None:
            return 0, 0
        batch, rows_counted = _ref(meta, data), False
    elif meta[kind] == _RECORD_BATCH:
        rows_counted = True
    else:
        return 0, 0
    length = _field(meta, batch, 0)
    rows = int(struct.unpack_from("<q", meta, length)[0]) if length is not None else 0
    compressed = _field(meta, batch, 3) is not None
    buffers = _field(meta, batch, 2)
    decoded = 0
    if buffers is not None:
        vec = _ref(meta, buffers)
        for i in range(_u32(meta, vec)):
            offset, size = struct.unpack_from("<qq", meta, vec + 4 + 16 * i)
            if not compressed or size < 8:
                decoded += max(int(size), 0)
                continue
            (plain,) = struct.unpack_from("<q", body, offset)
            decoded += int(size) - 8 if plain == -1 else int(plain)
            if plain < -1:
                raise ValueError(f"a buffer claims {plain} decoded bytes")
    return (rows if rows_counted else 0), decoded


def ipc_decoded_bytes(source: Any) -> int:
    """The bytes an Arrow IPC stream decodes to (its buffers, decompressed); nothing decoded.

    ``source`` is positioned at the stream (after the file format's magic).
    Raises ``ValueError``/``struct.error``/``pyarrow.ArrowException`` for a
    damaged stream.
    """
    import pyarrow as pa

    reader = pa.ipc.MessageReader.open_stream(source)
    total = 0
    while True:
        try:
            message = reader.read_next_message()
        except StopIteration:
            return total
        body = message.body
        _, decoded = _batch_decoded(
            message.metadata.to_pybytes(), memoryview(body) if body is not None else b""
        )
        total += decoded


# --------------------------------------------------------------------------
# Parquet: decoded sizes from row counts and the schema
# --------------------------------------------------------------------------


def row_width(kind: Any) -> int:
    """Bytes per row of a numeric or fixed-size-list column as NumPy holds it; 0 for others."""
    import pyarrow as pa

    values = 1
    while pa.types.is_fixed_size_list(kind):
        values *= kind.list_size
        kind = kind.value_type
    if pa.types.is_boolean(kind):
        return values
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return values * kind.bit_width // 8
    return 0


def parquet_decoded_bytes(meta: Any, schema: Any) -> int:
    """The bytes a Parquet file decodes to, from its metadata: every row at its full width.

    Numeric columns count ``rows x width`` (a boolean a byte, as NumPy holds it);
    every column chunk counts its pages decompressed.
    """
    per_row = sum(row_width(field.type) for field in schema)
    if "split" in schema.names:
        per_row += 8  # its labels, one reference a row
    total = 0
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        total += group.num_rows * per_row
        total += sum(
            max(group.column(j).total_uncompressed_size, 0) for j in range(group.num_columns)
        )
    return total
