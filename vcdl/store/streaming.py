"""A state group read and written a few tensors at a time, in bounded memory.

This module owns streaming access to format 2 state groups for states too
large to hold more than once or twice: the driver's merge of a
1B-parameter model (4 GB) reads the result and writes the new version a
batch of tensors at a time (:mod:`vcdl.driver.streamed`).

* :class:`StateReader` reads the group document once and then any subset of
  tensors, fetching only the chunks that hold them (a chunk shared by two
  batches is fetched for each); every tensor is verified against its
  recorded checksum as :meth:`WeightStore.read_state` does.
* :class:`StateWriter` is given the names, dtypes and shapes of the whole
  state up front (so the packing is that of :func:`~vcdl.store.layout.plan_write`,
  byte for byte), then the tensors in that order, in as many calls as the
  caller likes. Each chunk is written as soon as its bytes are complete,
  and each tensor hashed as its bytes are written (on a local disk a piece
  at a time, while the write has it in the cache:
  :meth:`~vcdl.store.groups.Groups.put_hashed`); :meth:`StateWriter.commit` writes the
  last chunks and the group document, the commit point, exactly as
  :meth:`WeightStore.write_state` does. A writer that is aborted or dies
  leaves an orphan, never a torn group.

A tensor larger than a batch goes in parts: :func:`batches` splits it into
rows, :meth:`StateReader.read_rows` reads (and verifies, in order) rows of
it, :meth:`StateWriter.write_rows` writes them. So a model whose one tensor
is most of its bytes (a language model's token embedding) still streams a
batch at a time.

Both do their I/O through the store's group layer,
:class:`~vcdl.store.groups.Groups`, as :class:`~vcdl.store.weights.WeightStore`
does (the same crash-safe start, chunk transport and commit point); the
store hands them its own (:meth:`~vcdl.store.weights.WeightStore.reader`,
:meth:`~vcdl.store.weights.WeightStore.writer`).

The writer keeps a reference to each tensor until the chunks holding its
bytes are written and hashed (no copies): at most about one chunk per dtype
beyond the tensors of the current call; those bytes must not change until then.

The reader, the writer and the batch plan are kept together: they are the
two ends of one streamed format and the plan they both follow; apart, each
would have to know the others' row and order rules.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from vcdl.errors import IntegrityError, StoreError
from vcdl.store.arrays import ArrayLayout, bits_dtype, bytes_of, zarr_dtype
from vcdl.store.groups import Groups
from vcdl.store.layout import (
    ATTR,
    Packed,
    WritePlan,
    check_identity,
    check_records,
    combined_checksum,
    consolidated_of,
    corrupt,
    json_attrs,
    plan_array,
    plan_read,
)
from vcdl.types import StateDict


@dataclass(frozen=True)
class TensorSpec:
    """What a tensor is, without its data."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def specs_of(state: Mapping[str, torch.Tensor]) -> list[TensorSpec]:
    """The specs of a state's tensors, in its order."""
    return [TensorSpec(k, t.dtype, tuple(t.shape)) for k, t in state.items()]


def meta_state(specs: Iterable[TensorSpec]) -> StateDict:
    """Data-less tensors with the specs' dtypes and shapes (for structure checks)."""
    return {s.name: torch.empty(s.shape, dtype=s.dtype, device="meta") for s in specs}


@dataclass(frozen=True)
class Part:
    """A whole tensor of a batch, or rows ``[start, stop)`` of its first dimension."""

    spec: TensorSpec
    start: int = 0
    stop: int | None = None
    """None: the whole tensor."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def whole(self) -> bool:
        return self.stop is None

    def of(self, tensor: torch.Tensor) -> torch.Tensor:
        """This part of ``tensor`` (the tensor itself, or a view of its rows)."""
        return tensor if self.stop is None else tensor[self.start : self.stop]


def batches(specs: Sequence[TensorSpec], limit: int) -> list[list[Part]]:
    """Consecutive tensors grouped up to ``limit`` bytes, in the specs' order.

    A tensor larger than ``limit`` is split into batches of its rows (each
    one part alone, at most ``limit`` bytes unless one row is larger), so
    that a model whose largest tensor is most of it (a language model's
    token embedding) still streams in batches of ``limit``; a vector or a
    scalar larger than ``limit`` is a batch alone, whole.
    """
    out: list[list[Part]] = []
    current: list[Part] = []
    size = 0
    for s in specs:
        if s.nbytes > limit and len(s.shape) >= 2 and s.shape[0] > 1:
            if current:
                out.append(current)
                current, size = [], 0
            rows = s.shape[0]
            per = max(1, limit // (s.nbytes // rows))
            out += [[Part(s, a, min(a + per, rows))] for a in range(0, rows, per)]
            continue
        if current and size + s.nbytes > limit:
            out.append(current)
            current, size = [], 0
        current.append(Part(s))
        size += s.nbytes
    if current:
        out.append(current)
    return out


def take(state: Mapping[str, torch.Tensor], parts: Sequence[Part]) -> StateDict:
    """The parts of an in-memory state (views of its tensors' rows; no copies)."""
    return {p.name: p.of(state[p.name]) for p in parts}


class TensorSource(Protocol):
    """What a streamed merge reads a state from: its specs, any subset of its tensors,
    and a big tensor's rows (read in order, each tensor's rows once: see
    :meth:`StateReader.read_rows`)."""

    @property
    def specs(self) -> list[TensorSpec]: ...

    def read(self, names: Iterable[str]) -> StateDict: ...

    def read_rows(self, name: str, start: int, stop: int) -> torch.Tensor: ...


def read_parts(source: TensorSource, parts: Sequence[Part]) -> StateDict:
    """One batch of :func:`batches` from ``source``: its whole tensors, or rows of one."""
    if len(parts) == 1 and not parts[0].whole:
        p = parts[0]
        assert p.stop is not None
        return {p.name: source.read_rows(p.name, p.start, p.stop)}
    if not all(p.whole for p in parts):
        raise ValueError("rows of a tensor are a batch alone (see batches)")
    return source.read([p.name for p in parts])


class StateReader:
    """One complete state group, read a subset of tensors at a time (see the module)."""

    def __init__(
        self, groups: Groups, path: str, verify: bool = True, expect: str | None = None
    ) -> None:
        self._groups = groups
        self._rel = groups.rel(path)
        self.uri = groups.shown(self._rel)  # for messages: redacted
        self.verify = verify
        doc = groups.run(groups.complete_doc(self._rel, self.uri), "reading", self.uri)
        vcdl = self._vcdl = doc["attributes"][ATTR]
        if vcdl.get("format") == 1:
            raise StoreError(
                f"{self.uri} is a format 1 group; streamed reads need format 2 (read it whole)"
            )
        if expect is not None:
            check_identity(vcdl, expect, self.uri)
        # The whole record table, checked before anything is allocated (bounds,
        # overlaps, sizes); every batch read later plans within it.
        self._meta = consolidated_of(doc, self.uri)
        table = self._table = check_records(vcdl.get("tensors"), self._meta, self.uri)
        self._records: dict[str, Any] = vcdl["tensors"]
        self.specs = [TensorSpec(r.name, r.dtype, r.shape) for r in table.records.values()]
        attrs = vcdl.get("attrs")
        if attrs is not None and not isinstance(attrs, dict):
            raise IntegrityError(f"{self.uri}: the group's attrs are not a mapping")
        self.attrs: dict[str, Any] = dict(attrs or {})
        # read_rows: per tensor being read in parts, the next row and the hash so far.
        self._hashing: dict[str, tuple[int, Any]] = {}

    def reopened(self, groups: Groups, verify: bool = True) -> StateReader:
        """This reader in a forked process: the root opened there (:meth:`Groups.reopened`),
        no rows read yet; ``verify`` False reads rows from anywhere, unverified (their
        tensor then verified whole by someone else)."""
        other = copy.copy(self)
        vars(other).update(_groups=groups, verify=verify, _hashing={})
        return other

    def checksum(self) -> str:
        """The group's content identity (:func:`~vcdl.store.layout.combined_checksum`)."""
        return combined_checksum(self._records)

    def read(self, names: Iterable[str]) -> StateDict:
        """The named tensors (in the order given), each verified; only their chunks are read."""
        wanted = list(names)
        missing = [n for n in wanted if n not in self._records]
        if missing:
            raise StoreError(f"{self.uri} has no tensor(s) {missing[:3]}")
        return self._groups.run(self._read(wanted), "reading", self.uri)

    def read_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start, stop)`` of tensor ``name``; only the chunks that hold them are read.

        A tensor's checksum covers all its bytes, so its rows are verified
        as they come, in order: the read of row 0 starts a hash, each read
        continues it from where the last one stopped, and the read of the
        last row compares it (:class:`IntegrityError` on a mismatch). The
        rows before the last are handed out before that comparison: a
        streamed merge that gets an error at the last rows drops what it
        made. Rows out of that order cannot be verified and are refused
        (``RuntimeError``: a caller's bug), unless ``verify`` is off.
        """
        rec = self._table.records.get(name)
        if rec is None:
            raise StoreError(f"{self.uri} has no tensor {name!r}")
        if not rec.shape or not 0 <= start < stop <= rec.shape[0]:
            raise IndexError(f"rows [{start}, {stop}) of {name!r} {list(rec.shape)}")
        hasher = None
        if self.verify:
            if start == 0:
                hasher = hashlib.sha256()
            else:
                at, hasher = self._hashing.get(name, (0, None))
                if at != start or hasher is None:
                    raise RuntimeError(
                        f"{self.uri}: rows of {name!r} read out of order (from {start}, "
                        f"expected {at}); they could not be verified"
                    )
        got = self._groups.run(self._read([name], (start, stop)), "reading", self.uri)[name]
        if hasher is not None:
            hasher.update(got.reshape(-1).view(torch.uint8).numpy().data)
            if stop < rec.shape[0]:
                self._hashing[name] = (stop, hasher)
            else:
                self._hashing.pop(name, None)
                if hasher.hexdigest() != rec.checksum:
                    raise corrupt(self.uri, name, rec.array, rec.offset)
        return got

    async def _read(self, only: list[str], rows: tuple[int, int] | None = None) -> StateDict:
        """The tensors named (rows of the one named), planned within the checked table."""
        plan = await asyncio.to_thread(
            plan_read, self._vcdl, self._meta, self.uri, only, self._table, rows
        )
        return await self._groups.read_tensors(self._rel, self.uri, plan, self.verify)


@dataclass
class _Array:
    """One flat array being written: its layout and the bytes not yet in a written chunk."""

    layout: ArrayLayout
    pieces: list[tuple[int, memoryview, Any]]  # (offset, bytes, their tensor's hasher)
    filled: int = 0  # bytes handed over so far
    next_chunk: int = 0


class StateWriter:
    """A state group written a batch of tensors at a time (see the module)."""

    def __init__(
        self,
        groups: Groups,
        path: str,
        specs: Sequence[TensorSpec],
        attrs: Mapping[str, Any] | None = None,
    ) -> None:
        self._groups = groups
        self._rel = groups.rel(path)
        self.uri = groups.shown(self._rel)  # for messages: redacted
        self._attrs = json_attrs(attrs, self.uri)
        self._specs = list(specs)
        self._next = 0
        self._hashers: list[Any] = []  # each tensor's SHA-256, fed as its chunks are written
        self._keep: list[Any] = []  # arrays whose memory the pending pieces view
        self._rows = 0  # write_rows: rows of the next tensor written so far
        self._hasher: Any = None  # and their hash so far
        self._done = False
        lengths: dict[str, int] = {}
        stored: dict[str, np.dtype] = {}
        self._packed: list[Packed] = []
        for s in self._specs:
            node = str(s.dtype).removeprefix("torch.")
            offset = lengths.get(node, 0)
            lengths[node] = offset + math.prod(s.shape)
            bits = bits_dtype(s.dtype)
            stored[node] = torch.empty(0, dtype=bits or s.dtype).numpy().dtype
            self._packed.append(Packed(s.name, node, s.shape, memoryview(b""), node, offset))
        self._arrays = {
            node: _Array(plan_array(node, zarr_dtype(stored[node]), stored[node].itemsize, n), [])
            for node, n in lengths.items()
        }
        groups.run(self._begin(), "writing", self.uri)

    async def _begin(self) -> None:
        metas = {node: a.layout.meta()[1] for node, a in self._arrays.items()}
        await self._groups.begin(self._rel, self.uri, metas, "vcdl")

    def write(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """The next tensors of the state, in the order of the specs given at the start."""
        if self._done:
            raise StoreError(f"writing {self.uri}: the writer is closed")
        for name, tensor in tensors.items():
            if self._rows:
                raise StoreError(
                    f"writing {self.uri}: tensor {self._specs[self._next].name!r} is written "
                    f"up to row {self._rows}; its other rows come first, not {name!r}"
                )
            if self._next >= len(self._specs):
                raise StoreError(f"writing {self.uri}: more tensors than announced ({name!r})")
            spec, packed = self._specs[self._next], self._packed[self._next]
            if name != spec.name or tensor.dtype != spec.dtype or tuple(tensor.shape) != spec.shape:
                raise StoreError(
                    f"writing {self.uri}: expected tensor {spec.name!r} {spec.dtype} "
                    f"{list(spec.shape)}, got {name!r} {tensor.dtype} {list(tensor.shape)}"
                )
            self._next += 1
            array = bytes_of(name, tensor, self.uri)
            data = array.reshape(-1).view(np.uint8).data
            hasher = hashlib.sha256()
            self._hashers.append(hasher)
            if data.nbytes:
                a = self._arrays[packed.array]
                self._keep.append(array)
                a.pieces.append((packed.offset * a.layout.itemsize, data, hasher))
                a.filled += data.nbytes
        self._flush(final=False)

    def write_rows(self, name: str, rows: torch.Tensor) -> None:
        """The next rows (of the first dimension) of the state's next tensor, ``name``.

        A tensor may come in several calls of its rows, in order; it is
        hashed as they are written, its checksum complete at the commit.
        """
        if self._done:
            raise StoreError(f"writing {self.uri}: the writer is closed")
        if self._next >= len(self._specs):
            raise StoreError(f"writing {self.uri}: more tensors than announced ({name!r})")
        spec, packed = self._specs[self._next], self._packed[self._next]
        if (
            name != spec.name
            or rows.dtype != spec.dtype
            or not spec.shape
            or tuple(rows.shape[1:]) != spec.shape[1:]
            or rows.dim() != len(spec.shape)
            or self._rows + rows.shape[0] > spec.shape[0]
        ):
            raise StoreError(
                f"writing {self.uri}: expected rows {self._rows}.. of tensor {spec.name!r} "
                f"{spec.dtype} {list(spec.shape)}, got {name!r} {rows.dtype} {list(rows.shape)}"
            )
        if self._rows == 0:
            self._hasher = hashlib.sha256()
            self._hashers.append(self._hasher)
        array = bytes_of(name, rows, self.uri)
        data = array.reshape(-1).view(np.uint8).data
        if data.nbytes:
            a = self._arrays[packed.array]
            at = (packed.offset + self._rows * math.prod(spec.shape[1:])) * a.layout.itemsize
            self._keep.append(array)
            a.pieces.append((at, data, self._hasher))
            a.filled += data.nbytes
        self._rows += rows.shape[0]
        if self._rows == spec.shape[0]:
            self._next += 1
            self._rows = 0
        self._flush(final=False)

    def _flush(self, final: bool) -> None:
        """Write the chunks whose bytes are complete, feeding each tensor's hasher
        with its bytes as they are written (in order: chunks of an array go in
        order, a tensor lives in one array)."""
        jobs: list[tuple[str, list[tuple[memoryview, Any]]]] = []
        for node, a in self._arrays.items():
            layout = a.layout
            if final:
                pad = layout.nchunks * layout.chunk_bytes - layout.data_bytes
                if pad:
                    a.pieces.append((layout.data_bytes, memoryview(bytes(pad)), None))
                    a.filled += pad
            while a.next_chunk < layout.nchunks and a.filled >= (a.next_chunk + 1) * (
                layout.chunk_bytes
            ):
                j = a.next_chunk
                lo, hi = j * layout.chunk_bytes, (j + 1) * layout.chunk_bytes
                # In order and contiguous: tensors arrive in their packing order.
                views = [(v, h) for _, v, h in _cut(a.pieces, lo, hi)]
                jobs.append((f"{node}/{layout.chunk_key(j)}", views))
                a.pieces = _cut(a.pieces, hi, None)
                a.next_chunk += 1
        if jobs:
            self._groups.run(self._groups.put_hashed(self._rel, jobs), "writing", self.uri)
        if all(not a.pieces for a in self._arrays.values()):
            self._keep.clear()

    def commit(self) -> str:
        """Write the last chunks and the group document (the commit point); the checksum."""
        if self._done:
            raise StoreError(f"writing {self.uri}: the writer is closed")
        if self._next != len(self._specs):
            missing = [s.name for s in self._specs[self._next :]][:3]
            if self._rows:
                missing[0] += f" (rows {self._rows}.. of {self._specs[self._next].shape[0]})"
            raise StoreError(f"writing {self.uri}: tensors never written: {missing}")
        self._flush(final=True)
        # Every byte is written and hashed: the checksums are complete.
        return self.publish([h.hexdigest() for h in self._hashers])

    # ---- for writers of parts of the group in other processes (vcdl.driver.sharded)

    @property
    def packing(self) -> tuple[list[Packed], dict[str, ArrayLayout]]:
        """Where each tensor goes (its array and offset) and each array's chunking."""
        return list(self._packed), {n: a.layout for n, a in self._arrays.items()}

    def reopened_groups(self) -> Groups:
        """The group's root opened afresh, for a forked process (:meth:`Groups.reopened`)."""
        return self._groups.reopened()

    def put_chunks(self, jobs: Sequence[tuple[str, Sequence[memoryview]]], groups: Groups) -> None:
        """Write whole chunks (``<array>/c.<j>`` and their buffers) through ``groups``
        (this root opened in the calling process: :meth:`Groups.reopened`)."""
        groups.run(groups.put_chunks(self._rel, jobs), "writing", self.uri)

    def put_hashed(
        self, jobs: Sequence[tuple[str, Sequence[tuple[memoryview, Any]]]], groups: Groups
    ) -> None:
        """:meth:`put_chunks`, each buffer with a hasher (or None): :meth:`Groups.put_hashed`."""
        groups.run(groups.put_hashed(self._rel, jobs), "writing", self.uri)

    def publish(self, checksums: Sequence[str]) -> str:
        """The commit point of a group whose chunks were written by :meth:`put_chunks`
        (all of them): its document with every tensor's checksum; the group's checksum."""
        if self._done:
            raise StoreError(f"writing {self.uri}: the writer is closed")
        self._done = True
        plan = WritePlan(self._packed, {n: a.layout for n, a in self._arrays.items()})
        self._groups.run(
            self._groups.publish(self._rel, plan.group_doc(checksums, self._attrs)),
            "writing",
            self.uri,
        )
        records = {
            p.name: {"dtype": p.dtype_name, "shape": list(p.shape), "checksum": c}
            for p, c in zip(self._packed, checksums, strict=True)
        }
        return combined_checksum(records)

    def abort(self) -> None:
        """Give up: delete what was written (an orphan if this fails too)."""
        if self._done:
            return
        self._done = True
        self._keep.clear()
        self._groups.run(self._groups.delete(self._rel), "deleting", self.uri)


def _cut(
    pieces: list[tuple[int, memoryview, Any]], lo: int, hi: int | None
) -> list[tuple[int, memoryview, Any]]:
    """The parts of byte ranges ``(offset, view, tag)`` inside ``[lo, hi)`` (hi None: no end)."""
    out = []
    for at, v, tag in pieces:
        end = at + v.nbytes
        start, stop = max(at, lo), end if hi is None else min(end, hi)
        if start < stop:
            out.append((start, v[start - at : stop - at], tag))
    return out
