"""The on-store layout of a state group (format 2): what goes where, no I/O.

Longer than ~500 lines on purpose: the write plan, the read plan and the
checks of what a reader takes from a stored document must agree byte for
byte, and are read together.

This module owns the bytes-level plan of a state group: which Zarr v3 arrays
hold which tensor at which offset, how large those arrays' chunks are, the
group's ``zarr.json``, the checksums, and the validation of everything a
reader takes from a stored document. One array's own metadata and the
stored form of each dtype are :mod:`vcdl.store.arrays`'s; moving the bytes
(local files, S3) is :mod:`vcdl.store.groups`'s; format 1 groups are read
by :mod:`vcdl.store.legacy`.

Layout of one state group at ``<path>`` (Zarr v3, format 2)::

    <path>/zarr.json            group metadata: attributes["vcdl"] and the
                                consolidated metadata of every array
    <path>/<dtype>/zarr.json    one flat 1-D array per torch dtype in the state
    <path>/<dtype>/c.<j>        its chunks: raw little-endian bytes, no
                                compression, ~CHUNK_BYTES each

Every tensor of one dtype is packed, in state order, into the array named
after the dtype (``float32``, ``bfloat16``, ``int64``...): its elements are
``array[offset : offset + numel]`` in C order. dtypes numpy lacks (bfloat16,
float8) are stored as their bits in the integer type of the same width. An
array of ``n`` elements gets ``k = ceil(n * itemsize / CHUNK_BYTES)`` chunks
of ``ceil(n / k)`` elements: Zarr stores the last chunk full-size, so the
padding (zeros) is under ``k`` elements, never most of a chunk (the
``chunks="auto"`` trap of docs/stack.md).

``attributes["vcdl"]`` is ``{"format": 2, "complete": True,
"checksum_algorithm": "sha256", "tensors": {name: {"dtype", "shape",
"checksum", "array", "offset"}}, "attrs": {...}}``; ``tensors`` keeps the
state dict's order. The checksum is SHA-256 of each tensor's own bytes, as in
format 1, so :func:`combined_checksum` (the content identity the ledger
records) does not depend on the format, the packing or the state's order.

Why packed: one array per tensor meant 320 directories and 640 files for a
ResNet-50; creating them cost 0.4-0.7 s here while the same 98 MiB written
as 25 chunk files took 0.03-0.04 s (torch.save: 0.08 s). Hashing stays per
tensor (the unit a corruption report names), on large buffers in worker
threads (hashlib drops the GIL). Measured on 100 MB here: sha256 58-95 ms
(SHA-NI), sha1 ~15% faster but broken, blake2b 2x and md5 3x slower,
zlib.crc32 37 ms but 32 bits are thin for a content identity.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from vcdl.errors import ChecksumMismatch, IntegrityError, StoreError
from vcdl.store.arrays import (
    ArrayLayout,
    bits_dtype,
    bytes_of,
    is_int,
    parse_array,
    torch_dtype,
    zarr_dtype,
)
from vcdl.types import StateDict

FORMAT = 2
"""Version of the state-group layout written; :data:`READABLE_FORMATS` are read."""

READABLE_FORMATS = (1, 2)

CHECKSUM_ALGORITHM = "sha256"
"""Per-tensor checksum, recorded in every group."""

CHUNK_BYTES = 4 << 20
"""Target chunk size: few files per group, still several chunks to move in parallel."""

ATTR = "vcdl"
"""The key of a state group's own record in its document's attributes."""

# Tensors smaller than this are hashed together in one worker-thread job: a
# thread hop costs ~50-100 us on a busy machine, 320 of them ~30 ms.
HASH_BATCH_BYTES = 4 << 20

# What an array node name recorded in a group may look like (a dtype name).
_NODE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,99}")


def digest(data: memoryview) -> str:
    """Hex SHA-256 of a contiguous buffer."""
    return hashlib.sha256(data).hexdigest()


def combined_checksum(tensors: Mapping[str, Mapping[str, Any]]) -> str:
    """One SHA-256 over (name, dtype, shape, checksum) of every tensor, by name."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        rec = tensors[name]
        line = json.dumps([name, rec.get("dtype"), rec.get("shape"), rec.get("checksum")])
        h.update(line.encode() + b"\n")
    return h.hexdigest()


def check_identity(vcdl: Mapping[str, Any], expect: str, uri: str) -> None:
    """Refuse a group whose records do not hash to ``expect``, the identity the ledger recorded.

    A group's own checksums vouch for its bytes only against that same
    group's records: one rewritten with fresh, valid checksums passes them.
    The ledger's record, taken when the version was made, does not move with
    it.
    """
    records = vcdl.get("tensors")
    if not isinstance(records, dict) or not all(isinstance(r, dict) for r in records.values()):
        raise IntegrityError(f"{uri}: the group records no tensors")
    got = combined_checksum(records)
    if got != expect:
        raise ChecksumMismatch(
            f"{uri} does not hold what the ledger recorded (content checksum {got[:12]}, "
            f"the ledger's {str(expect)[:12]}): the group was rewritten after it was "
            "recorded; refusing to read it"
        )


def consolidated_of(doc: Mapping[str, Any], uri: str) -> dict[str, Any]:
    """The array metadata consolidated into a group's document, checked to be a mapping."""
    consolidated = doc.get("consolidated_metadata") or {}
    meta = consolidated.get("metadata") if isinstance(consolidated, dict) else None
    if meta is None and not consolidated:
        return {}
    if not isinstance(meta, dict):
        raise IntegrityError(f"{uri}: the group's consolidated metadata is malformed")
    return meta


def plan_array(node: str, data_type: str, itemsize: int, length: int) -> ArrayLayout:
    """An array of ``length`` elements in ``k = ceil(bytes / CHUNK_BYTES)`` chunks of equal
    element count (the last one padded by fewer than ``k`` elements)."""
    k = max(1, -(-length * itemsize // CHUNK_BYTES))
    return ArrayLayout(node, data_type, itemsize, length, max(1, -(-length // k)))


# ------------------------------------------------------------------- writing


@dataclass
class Packed:
    """One tensor to write: its bytes and where they go."""

    name: str
    dtype_name: str
    shape: tuple[int, ...]
    data: memoryview  # the tensor's bytes, C order, little-endian
    array: str
    offset: int  # in elements of the array


@dataclass
class WritePlan:
    """Every tensor of a state placed in its array, and the arrays' chunking."""

    tensors: list[Packed]
    arrays: dict[str, ArrayLayout] = field(default_factory=dict)

    def chunk_views(self) -> list[tuple[ArrayLayout, int, list[memoryview]]]:
        """Per chunk to write: its array, index and the buffers that make it up, in order."""
        by_array: dict[str, list[tuple[int, memoryview]]] = {n: [] for n in self.arrays}
        for t in self.tensors:
            if t.data.nbytes:
                by_array[t.array].append((t.offset * self.arrays[t.array].itemsize, t.data))
        out = []
        for node, layout in self.arrays.items():
            pad = layout.nchunks * layout.chunk_bytes - layout.data_bytes
            pieces = by_array[node]
            if pad:
                pieces.append((layout.data_bytes, memoryview(bytes(pad))))
            for j, views in enumerate(split(pieces, layout.chunk_bytes, layout.nchunks)):
                out.append((layout, j, [v for _, v in views]))
        return out

    def hash_jobs(self) -> list[list[int]]:
        """Indices of tensors, in batches of about HASH_BATCH_BYTES, to hash in one job each."""
        return batches([t.data.nbytes for t in self.tensors], HASH_BATCH_BYTES)

    def group_doc(self, checksums: Sequence[str], user_attrs: dict[str, Any]) -> bytes:
        """The group's zarr.json: the commit point, written last."""
        tensors = {
            t.name: {
                "dtype": t.dtype_name,
                "shape": list(t.shape),
                "checksum": checksum,
                "array": t.array,
                "offset": t.offset,
            }
            for t, checksum in zip(self.tensors, checksums, strict=True)
        }
        vcdl = {
            "format": FORMAT,
            "complete": True,
            "checksum_algorithm": CHECKSUM_ALGORITHM,
            "tensors": tensors,
            "attrs": user_attrs,
        }
        doc = {
            "zarr_format": 3,
            "node_type": "group",
            "attributes": {ATTR: vcdl},
            "consolidated_metadata": {
                "kind": "inline",
                "must_understand": False,
                "metadata": {node: a.meta()[0] for node, a in self.arrays.items()},
            },
        }
        return json.dumps(doc, allow_nan=True).encode()


def plan_write(state: StateDict, uri: str) -> WritePlan:
    """Check ``state`` and place each tensor; no copies for contiguous CPU tensors."""
    if not isinstance(state, Mapping):
        raise StoreError(f"writing {uri}: state must be a dict of tensors")
    tensors: list[Packed] = []
    lengths: dict[str, int] = {}
    stored: dict[str, np.dtype] = {}
    for name, tensor in state.items():
        if not isinstance(name, str) or not name:
            raise StoreError(f"writing {uri}: tensor names must be non-empty strings: {name!r}")
        if not isinstance(tensor, torch.Tensor):
            raise StoreError(f"writing {uri}: {name!r} is a {type(tensor).__name__}, not a tensor")
        array = bytes_of(name, tensor, uri)
        dtype_name = str(tensor.dtype).removeprefix("torch.")
        offset = lengths.get(dtype_name, 0)
        lengths[dtype_name] = offset + array.size
        stored[dtype_name] = array.dtype
        data = array.reshape(-1).view(np.uint8).data
        tensors.append(Packed(name, dtype_name, tuple(tensor.shape), data, dtype_name, offset))
    plan = WritePlan(tensors)
    for node, length in lengths.items():
        np_dtype = stored[node]
        try:
            layout = plan_array(node, zarr_dtype(np_dtype), np_dtype.itemsize, length)
            layout.meta()  # let zarr judge the dtype now
        except (TypeError, ValueError) as exc:  # a dtype zarr cannot describe
            raise StoreError(f"cannot store tensors of dtype {node}: {exc}") from exc
        plan.arrays[node] = layout
    return plan


def split(
    pieces: Sequence[tuple[int, memoryview]], chunk_bytes: int, nchunks: int
) -> list[list[tuple[int, memoryview]]]:
    """Cut byte ranges ``(array offset, buffer)`` at chunk boundaries.

    Returns, per chunk, ``(offset in the chunk, part of the buffer)`` for
    every piece overlapping it, in the order given.
    """
    chunks: list[list[tuple[int, memoryview]]] = [[] for _ in range(nchunks)]
    for start, view in pieces:
        pos, n = 0, view.nbytes
        while pos < n:
            j, at = divmod(start + pos, chunk_bytes)
            take = min(n - pos, chunk_bytes - at)
            chunks[j].append((at, view[pos : pos + take]))
            pos += take
    return chunks


def batches(sizes: Sequence[int], limit: int) -> list[list[int]]:
    """Consecutive indices grouped until each group holds at least ``limit`` bytes."""
    out: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i, size in enumerate(sizes):
        current.append(i)
        total += size
        if total >= limit:
            out.append(current)
            current, total = [], 0
    if current:
        out.append(current)
    return out


# ------------------------------------------------------------------- reading


@dataclass
class ReadTensor:
    """One tensor being read: its fresh memory and what its bytes must hash to."""

    name: str
    tensor: torch.Tensor
    data: memoryview  # the tensor's own memory as bytes
    checksum: object  # None: rows of a tensor, hashed by the StateReader reading them in order
    array: str
    offset: int


@dataclass
class ChunkRead:
    """One chunk to fetch: where its bytes go, and which tensors it feeds."""

    array: ArrayLayout
    index: int
    pieces: list[tuple[int, memoryview]]  # (offset in chunk, destination)
    pad_from: int | None  # the last chunk: bytes from here on are padding (zeros)
    tensors: list[str]

    @property
    def key(self) -> str:
        return f"{self.array.node}/{self.array.chunk_key(self.index)}"

    def describe(self) -> str:
        names = ", ".join(repr(n) for n in self.tensors[:3])
        more = f" (+{len(self.tensors) - 3} more)" if len(self.tensors) > 3 else ""
        label = "tensor" if len(self.tensors) == 1 else "tensors"
        return (
            f"chunk {self.array.chunk_key(self.index)} of array {self.array.node!r} "
            f"({label} {names}{more})"
        )

    def runs(self) -> list[tuple[int, list[memoryview]]]:
        """The pieces as runs of contiguous chunk bytes: one read call each."""
        runs: list[tuple[int, list[memoryview]]] = []
        end = -1
        for at, view in self.pieces:
            if at == end:
                runs[-1][1].append(view)
            else:
                runs.append((at, [view]))
            end = at + view.nbytes
        return runs

    def check_size(self, size: int, uri: str) -> None:
        if size != self.array.chunk_bytes:
            raise IntegrityError(
                f"{uri}: {self.describe()} has {size} bytes, expected {self.array.chunk_bytes}"
            )

    def check_padding(self, padding: bytes | memoryview, uri: str) -> None:
        if any(padding):
            raise IntegrityError(f"{uri}: padding of {self.describe()} is not zero: corrupt")


@dataclass
class ReadPlan:
    tensors: list[ReadTensor]
    chunks: list[ChunkRead]

    def hash_jobs(self) -> list[list[int]]:
        return batches([t.data.nbytes for t in self.tensors], HASH_BATCH_BYTES)

    def state(self) -> StateDict:
        if sys.byteorder != "little":
            for t in self.tensors:
                arr = t.tensor.view(bits_dtype(t.tensor.dtype) or t.tensor.dtype).numpy()
                arr.byteswap(inplace=True)
        return {t.name: t.tensor for t in self.tensors}


# What a record table may claim before anything is allocated (see check_records).
MAX_DIMS = 32
MAX_ELEMENTS = 1 << 60
MIN_CHUNK_BYTES = 1 << 20
"""vcdl writes chunks of about CHUNK_BYTES (never below half of it), or one chunk for an
array smaller than that. A stored array chunked finer than a quarter of the smaller of
the two would make a reader plan (and list) one entry per chunk of an absurd count, and
is refused."""


@dataclass(frozen=True)
class Record:
    """One tensor's record in a group's table, checked (see :func:`check_records`)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    numel: int
    array: str
    offset: int
    checksum: str


@dataclass
class CheckedTable:
    """A group's record table, validated against its arrays: safe to allocate."""

    records: dict[str, Record]
    arrays: dict[str, ArrayLayout]

    @property
    def nbytes(self) -> int:
        return sum(a.data_bytes for a in self.arrays.values())


def check_record(name: object, rec: object, uri: str) -> tuple[torch.dtype, tuple[int, ...], int]:
    """A record's dtype, shape and offset, refusing malformed ones. Pure, allocates nothing."""
    if not isinstance(name, str) or not name:
        raise IntegrityError(f"{uri}: a tensor record has a bad name {name!r}")
    if not isinstance(rec, dict):
        raise IntegrityError(f"{uri}: record of tensor {name!r} is malformed")
    dtype = torch_dtype(rec.get("dtype"), uri, name)
    shape, offset = rec.get("shape"), rec.get("offset")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_DIMS
        or not all(is_int(s) and 0 <= s < MAX_ELEMENTS for s in shape)
        or not isinstance(offset, int)
        or isinstance(offset, bool)
        or not 0 <= offset < MAX_ELEMENTS
    ):
        raise IntegrityError(f"{uri}: tensor {name!r} records a bad shape or offset")
    if math.prod(shape) >= MAX_ELEMENTS:
        raise IntegrityError(f"{uri}: tensor {name!r} records an absurd shape {shape}")
    if not isinstance(rec.get("checksum"), str):
        raise IntegrityError(f"{uri}: tensor {name!r} records no checksum")
    return dtype, tuple(shape), offset


def check_records(
    records: object,
    arrays_meta: Mapping[str, Any],
    uri: str,
    memory: int | None = None,
) -> CheckedTable:
    """Validate a format 2 group's record table against its arrays, before any allocation.

    Pure: nothing is read or allocated. Refuses, with an :class:`IntegrityError`
    naming the group and the tensor: a malformed record, an unknown dtype, a
    shape or offset that is not a non-negative integer, a dtype whose width
    differs from its array's, a tensor past its array's end, two tensors
    whose bytes overlap, arrays whose records do not add up to exactly the
    array's length (vcdl packs each array end to end), arrays chunked finer
    than vcdl ever writes, and a group whose arrays claim more bytes than
    ``memory`` (default: this machine's physical memory).
    """
    if not isinstance(records, dict):
        raise IntegrityError(f"{uri}: the group records no tensors")
    layouts: dict[str, ArrayLayout] = {}
    checked: dict[str, Record] = {}
    spans: dict[str, list[tuple[int, int, str]]] = {}
    for name, rec in records.items():
        dtype, shape, offset = check_record(name, rec, uri)
        node = rec.get("array")
        if not isinstance(node, str) or not _NODE.fullmatch(node):
            raise IntegrityError(f"{uri}: tensor {name!r} records a bad array {node!r}")
        layout = layouts.get(node)
        if layout is None:
            meta = arrays_meta.get(node)
            if not isinstance(meta, dict):
                raise IntegrityError(f"{uri}: no array metadata for {node!r} (tensor {name!r})")
            layout = layouts[node] = parse_array(meta, node, uri)
            floor = min(CHUNK_BYTES, MIN_CHUNK_BYTES) // 4
            if layout.length >= MAX_ELEMENTS or layout.chunk_bytes < min(layout.data_bytes, floor):
                raise IntegrityError(
                    f"{uri}: array {node!r} ({layout.length} elements in chunks of "
                    f"{layout.chunk_elems}) is not in vcdl's layout"
                )
        numel = math.prod(shape)
        if dtype.itemsize != layout.itemsize or offset + numel > layout.length:
            raise IntegrityError(
                f"{uri}: tensor {name!r} ({dtype}, {numel} elements at {offset}) does not "
                f"fit array {node!r} ({layout.data_type}, {layout.length} elements)"
            )
        checked[name] = Record(name, dtype, shape, numel, node, offset, rec["checksum"])
        if numel:
            spans.setdefault(node, []).append((offset, offset + numel, name))
    for node, layout in layouts.items():
        items = sorted(spans.get(node, []))
        for (_, end, before), (start, _, name) in itertools.pairwise(items):
            if start < end:
                raise IntegrityError(
                    f"{uri}: tensors {before!r} and {name!r} overlap in array {node!r}"
                )
        total = sum(end - start for start, end, _ in items)
        if total != layout.length:
            raise IntegrityError(
                f"{uri}: the tensors of array {node!r} hold {total} elements, the array "
                f"{layout.length}: the record table does not describe the array"
            )
    table = CheckedTable(checked, layouts)
    limit = physical_memory() if memory is None else memory
    if limit is not None and table.nbytes > limit:
        raise IntegrityError(
            f"{uri}: the group claims {table.nbytes} bytes of tensors, more than this "
            f"machine's memory ({limit} bytes); refusing to allocate it"
        )
    return table


@functools.cache
def physical_memory() -> int | None:
    """This machine's physical memory in bytes, or None where the OS does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return None


def plan_read(
    vcdl: Mapping[str, Any],
    arrays_meta: Mapping[str, Any],
    uri: str,
    only: Sequence[str] | None = None,
    table: CheckedTable | None = None,
    rows: tuple[int, int] | None = None,
) -> ReadPlan:
    """Validate a format 2 group's records (all of them), then allocate the memory of the
    tensors to read (``only`` those named, in that order, if given). ``table``: the
    records already checked (a :class:`~vcdl.store.streaming.StateReader` checks them
    once, not at every batch). ``rows``: only rows ``[start, stop)`` (of the first
    dimension) of the one tensor named in ``only``; a part of a tensor has no checksum
    of its own (its reader hashes the parts in order, see
    :meth:`~vcdl.store.streaming.StateReader.read_rows`)."""
    if table is None:
        table = check_records(vcdl.get("tensors"), arrays_meta, uri)
    names = list(table.records) if only is None else list(only)
    if rows is not None and len(names) != 1:
        raise ValueError(f"rows of one tensor at a time, not of {len(names)}")
    tensors: list[ReadTensor] = []
    by_array: dict[str, list[tuple[int, memoryview, str]]] = {}
    for name in names:
        rec = table.records.get(name)
        if rec is None:
            raise StoreError(f"{uri} has no tensor {name!r}")
        layout = table.arrays[rec.array]
        shape, offset = rec.shape, rec.offset
        checksum: str | None = rec.checksum
        if rows is not None:
            start, stop = rows
            if not rec.shape or not 0 <= start < stop <= rec.shape[0]:
                raise IndexError(f"rows [{start}, {stop}) of {name!r} {list(rec.shape)}")
            shape = (stop - start, *rec.shape[1:])
            offset += start * math.prod(rec.shape[1:])
            checksum = None
        tensor = torch.empty(shape, dtype=rec.dtype)
        numel = tensor.numel()
        data = tensor.reshape(-1).view(torch.uint8).numpy().data if numel else memoryview(b"")
        tensors.append(ReadTensor(name, tensor, data, checksum, rec.array, offset))
        if numel:
            by_array.setdefault(rec.array, []).append((offset * layout.itemsize, data, name))
    chunks: list[ChunkRead] = []
    for node, items in by_array.items():
        layout = table.arrays[node]
        items.sort(key=lambda item: item[0])
        per_chunk = split([(at, view) for at, view, _ in items], layout.chunk_bytes, layout.nchunks)
        names_of = _names_per_chunk(items, layout)
        for j, pieces in enumerate(per_chunk):
            if not pieces:
                continue
            last = j == layout.nchunks - 1
            pad_from = layout.data_bytes - j * layout.chunk_bytes if last else None
            chunks.append(ChunkRead(layout, j, pieces, pad_from, names_of[j]))
    return ReadPlan(tensors, chunks)


def _names_per_chunk(
    items: list[tuple[int, memoryview, str]], layout: ArrayLayout
) -> list[list[str]]:
    names: list[list[str]] = [[] for _ in range(layout.nchunks)]
    for at, view, name in items:
        first, last = at // layout.chunk_bytes, (at + view.nbytes - 1) // layout.chunk_bytes
        for j in range(first, last + 1):
            names[j].append(name)
    return names


def verify(tensors: Sequence[ReadTensor], uri: str) -> None:
    """Raise IntegrityError naming the first tensor whose bytes miss their checksum."""
    for t in tensors:
        if t.checksum is not None and digest(t.data) != t.checksum:
            raise corrupt(uri, t.name, t.array, t.offset)


def corrupt(uri: str, name: str, array: str, offset: int) -> IntegrityError:
    """The error for a tensor whose stored bytes miss their checksum."""
    return IntegrityError(
        f"{uri}: checksum mismatch in tensor {name!r} (array {array!r}, offset "
        f"{offset}): stored bytes are corrupt"
    )


# -------------------------------------------------------------- group docs


def is_state_doc(doc: Mapping[str, Any]) -> bool:
    """A group document with vcdl's record in its attributes (complete or not)."""
    attrs = doc.get("attributes")
    return doc.get("node_type") == "group" and isinstance(attrs, dict) and ATTR in attrs


def is_complete(doc: Mapping[str, Any]) -> bool:
    """The document of a state group whose write was committed."""
    if not is_state_doc(doc):
        return False
    vcdl = doc["attributes"][ATTR]
    return isinstance(vcdl, dict) and vcdl.get("complete") is True and "tensors" in vcdl


def json_attrs(attrs: Mapping[str, Any] | None, uri: str) -> dict[str, Any]:
    """A writer's ``attrs`` as the group document will hold them (a JSON round trip)."""
    if attrs is None:
        return {}
    try:
        return dict(json.loads(json.dumps(dict(attrs), allow_nan=True)))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"writing {uri}: attrs must be JSON-serializable: {exc}") from exc
