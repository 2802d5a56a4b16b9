"""One merger process's work in a sharded merge (``merge.mergers``): its range, merged and written.

:mod:`vcdl.driver.sharded` forks K of these; each gets a :class:`Job` (what
every merger shares, inherited through the fork: the head, the inputs, the
version being written, the shared buffers) and its range's pieces
(:func:`~vcdl.driver.merge_ranges.range_pieces`). :func:`merge_range` runs
the same :func:`~vcdl.driver.streamed.chain` as one merger over the range's
batches, copies this range's elements into the shared new weights (and
rule state), writes the range's chunks as they fill and hashes the tensors
wholly inside it as their chunks are written (a piece at a time, while in
the cache: :meth:`~vcdl.store.groups.Groups.put_hashed`), in a writer thread
beside the chain.

A tensor that crosses a boundary is merged by each merger over the rows
holding its part, and only its part is kept. Its checksum covers all of
it: the merger with its first part (its *owner*) hashes it whole from the
shared weights once every other merger with a part of it has raised its
semaphore (each releases its own when its first piece is done, and when it
ends, so a refused range never leaves its neighbour waiting; a semaphore,
not a flag in shared memory, so that the bytes before it are seen on any
processor). Its inputs are read
unverified in rows here and verified whole by the driver.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch

from vcdl.driver.merge_ranges import Piece, Placed
from vcdl.driver.stages import Stage
from vcdl.driver.streamed import Decoded, Step, Unreadable, chain
from vcdl.merge.checks import update_norm
from vcdl.merge.codec import stored_names
from vcdl.merge.rules import STEP_KEY, MergeRule
from vcdl.store.arrays import bytes_of
from vcdl.store.groups import Groups
from vcdl.store.layout import digest
from vcdl.store.streaming import Part, StateReader, StateWriter, TensorSource, specs_of
from vcdl.types import StateDict

BEFORE_BATCH: Any = None
"""Tests: ``f(merger, batch)`` called in a merger before each batch (to kill one mid-merge)."""


@dataclass
class Job:
    """What every merger of one try shares (inherited through the fork)."""

    rule: MergeRule
    head: StateDict
    steps: Sequence[Step]
    version: StateWriter
    placed: list[Placed]
    layouts: dict[str, Any]
    split: set[str]  # the tensors that cross a range boundary
    owners: dict[str, tuple[int, list[int]]]  # of each: its owner, and the others with a part
    shared: StateDict  # the new weights, in shared memory
    state: StateDict | None
    state_out: StateDict | None  # the rule's new state, in shared memory
    ready: list[Any]  # merger i's first piece is done: a semaphore (a memory barrier too)
    batch_bytes: int


@dataclass
class Report:
    """What one merger sends back (as JSON through a pipe)."""

    reason: str | None = None
    failed: int | None = None
    norm_sq: list[float] = field(default_factory=list)
    checksums: dict[str, str] = field(default_factory=dict)
    step: int | None = None
    busy: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # an error of the merger's own (writing): not the result's


def merge_range(job: Job, index: int, pieces: list[Piece], groups: Groups) -> Report:
    """Merge, write and hash range ``index`` (its ``pieces``); ``groups``: the store,
    opened in this process."""
    try:
        report = _merge(job, index, pieces, groups)
    finally:
        job.ready[index].release()  # whatever happened: no neighbour waits for us any more
    if report.reason is None:
        for name, (owner, others) in job.owners.items():
            if owner == index:
                for i in others:  # a neighbour that died: the driver kills us all
                    job.ready[i].acquire()
                report.checksums[name] = digest_of(name, job.shared[name], job.version.uri)
    return report


def _merge(job: Job, index: int, pieces: list[Piece], groups: Groups) -> Report:
    rule, head, shared, state, state_out = job.rule, job.head, job.shared, job.state, job.state_out
    split = job.split
    specs = {s.name: s for s in specs_of(head)}
    own = {p.name: p for p in pieces}
    mine = [_reopen(s, groups, split) for s in job.steps]
    plan = _batches(pieces, specs, job.batch_bytes)
    # The batch after which this range's first piece is done (a neighbour may wait for it).
    first_done = 1 + max(b for b, batch in enumerate(plan) if batch[0].name == pieces[0].name)
    # Merged in place into the shared tensors, but for those crossing a boundary:
    # their rows are merged privately and only this range's elements copied over.
    into = {n: torch.empty_like(t) if n in split else t for n, t in shared.items()}
    chunks = _ChunkWriter(job.version, groups, job.placed, job.layouts, pieces, shared)
    report = Report()
    busy = {"read": 0.0, "merge": 0.0, "write": 0.0}
    count = [0]

    def emit(parts: list[Part], current: StateDict, state_sub: StateDict | None) -> None:
        for p in parts:
            _own_into(shared[p.name], current[p.name], p, own[p.name])
            if state_out is not None and state_sub is not None and p.name in state_sub:
                _own_into(state_out[p.name], state_sub[p.name], p, own[p.name])
        if state_sub is not None and STEP_KEY in state_sub:
            report.step = int(state_sub[STEP_KEY])
        writing.put(parts)
        count[0] += 1
        if count[0] == first_done:
            job.ready[index].release()
        if BEFORE_BATCH is not None:
            BEFORE_BATCH(index, count[0])

    def norm_of(parts: list[Part], ref: StateDict, sub: StateDict) -> float:
        # Only this range's elements count: a neighbour counts the rest of a row.
        mine_ref = {p.name: _own_view(ref[p.name], p, own[p.name]) for p in parts}
        mine_sub = {p.name: _own_view(sub[p.name], p, own[p.name]) for p in parts}
        return update_norm(mine_ref, mine_sub)

    def write(parts: list[Part]) -> None:
        t = time.perf_counter()
        chunks.advance(parts)  # hashing the tensors wholly ours as it writes them
        busy["write"] += time.perf_counter() - t

    if BEFORE_BATCH is not None:
        BEFORE_BATCH(index, 0)
    try:
        with Stage(write, depth=2) as writing:
            chained = chain(
                rule, head, mine, plan, emit, state=state, out=into, busy=busy, norm_of=norm_of
            )
    except Unreadable as exc:
        return Report(reason=str(exc), failed=exc.step)
    if chained.reason is not None:
        return Report(reason=chained.reason, failed=chained.failed)
    t = time.perf_counter()
    chunks.finish()
    report.checksums.update(chunks.checksums())
    busy["write"] += time.perf_counter() - t
    report.norm_sq, report.busy = chained.norm_sq, busy
    return report


def _batches(pieces: list[Piece], specs: dict[str, Any], limit: int) -> list[list[Part]]:
    """A range's pieces as batches of parts, as :func:`~vcdl.store.streaming.batches` makes
    them: whole tensors up to ``limit`` bytes together; rows of a tensor larger than a batch,
    or of one only partly in the range (the rows that hold its part), a batch alone."""
    out: list[list[Part]] = []
    current: list[Part] = []
    size = 0
    for piece in pieces:
        s = specs[piece.name]
        rows = len(s.shape) >= 2 and s.shape[0] > 1
        if rows and (s.nbytes > limit or not piece.whole):
            if current:
                out.append(current)
                current, size = [], 0
            row = math.prod(s.shape[1:])
            first, stop = piece.lo // row, -(-piece.hi // row)
            per = max(1, limit // max(1, row * s.dtype.itemsize))
            out += [[Part(s, a, min(a + per, stop))] for a in range(first, stop, per)]
            continue
        if current and size + s.nbytes > limit:
            out.append(current)
            current, size = [], 0
        current.append(Part(s))
        size += s.nbytes
    if current:
        out.append(current)
    return out


def _span(part: Part, piece: Piece) -> tuple[int, int, int]:
    """Where ``part``'s elements start in its tensor, and this range's ``[lo, hi)`` of them."""
    start = 0 if part.whole else part.start * math.prod(part.spec.shape[1:])
    return start, piece.lo, piece.hi


def _own_view(t: torch.Tensor, part: Part, piece: Piece) -> torch.Tensor:
    """This range's elements of a part's tensor (flat)."""
    start, lo, hi = _span(part, piece)
    flat = t.reshape(-1)
    return flat[max(lo, start) - start : max(0, min(hi, start + flat.numel()) - start)]


def _own_into(dst: torch.Tensor, src: torch.Tensor, part: Part, piece: Piece) -> None:
    """Copy this range's elements of a merged part into the shared tensor (if not there)."""
    start, lo, hi = _span(part, piece)
    a, b = max(lo, start), min(hi, start + src.numel())
    if a >= b:
        return
    got, into = src.reshape(-1)[a - start : b - start], dst.view(-1)[a:b]
    if got.data_ptr() != into.data_ptr():
        into.copy_(got)


class _Split:
    """A result or base as one merger reads it: rows of the tensors that cross a range
    boundary unverified (the driver verifies them whole), everything else verified."""

    def __init__(self, reader: StateReader, groups: Groups, split: set[str]) -> None:
        self._verified = reader.reopened(groups)
        self._unverified = reader.reopened(groups, verify=False)
        self._split = split
        self.specs = reader.specs

    def read(self, names: Any) -> StateDict:
        return self._verified.read(names)

    def read_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        reader = self._unverified if name in self._split else self._verified
        return reader.read_rows(name, start, stop)


def _reopen(step: Step, groups: Groups, split: set[str]) -> Step:
    """A fold's step with its readers opened in this merger."""

    def source(s: Any) -> Any:
        return _Split(s, groups, split) if isinstance(s, StateReader) else s

    result: TensorSource = step.result
    base = source(step.base)
    if isinstance(result, Decoded):
        decoded = object.__new__(Decoded)
        decoded.__dict__.update(result.__dict__)
        names = stored_names(sorted(split), result._floating, result.precision)
        decoded._stored = cast(StateReader, _Split(result._stored, groups, set(names)))
        decoded.base = source(result.base)
        if step.base is result.base:
            base = decoded.base
        result = decoded
    else:
        result = source(result)
    return Step(result, step.alpha, base)


def digest_of(name: str, tensor: torch.Tensor, uri: str) -> str:
    return digest(bytes_of(name, tensor, uri).reshape(-1).view(np.uint8).data)


class _ChunkWriter:
    """A range's chunks written from the shared new weights as they are complete."""

    def __init__(
        self,
        version: StateWriter,
        groups: Groups,
        placed: list[Placed],
        layouts: dict[str, Any],
        pieces: list[Piece],
        shared: StateDict,
    ) -> None:
        self._version, self._groups, self._layouts = version, groups, layouts
        self._where = {p.name: p for p in placed}
        self._own = {p.name: p for p in pieces}
        self._by_node: dict[str, list[Placed]] = {}
        for p in placed:
            self._by_node.setdefault(p.node, []).append(p)
        self._shared = shared
        # The tensors wholly in this range: hashed as their chunks are written.
        self._hashers = {p.name: hashlib.sha256() for p in pieces if p.whole}
        self._next: dict[str, int] = {}  # per array: the next chunk of ours to write
        self._stop: dict[str, int] = {}
        self._filled: dict[str, int] = {}  # per array: our elements complete up to here
        for piece in pieces:
            at = self._where[piece.name]
            layout = layouts[at.node]
            first = (at.offset + piece.lo) // layout.chunk_elems
            self._next[at.node] = min(self._next.get(at.node, first), first)
            self._stop[at.node] = max(
                self._stop.get(at.node, 0), -(-(at.offset + piece.hi) // layout.chunk_elems)
            )

    def advance(self, parts: list[Part]) -> None:
        """The chunks the merged ``parts`` completed."""
        for p in parts:
            at, piece = self._where[p.name], self._own[p.name]
            start, _, hi = _span(p, piece)
            count = (
                math.prod(p.spec.shape)
                if p.stop is None
                else p.stop * (math.prod(p.spec.shape[1:])) - start
            )
            end = at.offset + min(hi, start + count)
            self._filled[at.node] = max(self._filled.get(at.node, 0), end)
        self._write(final=False)

    def finish(self) -> None:
        self._write(final=True)

    def checksums(self) -> dict[str, str]:
        """The tensors wholly in this range and their checksums (once :meth:`finish`ed)."""
        return {name: h.hexdigest() for name, h in self._hashers.items()}

    def _write(self, final: bool) -> None:
        jobs = []
        for node, j in list(self._next.items()):
            layout = self._layouts[node]
            stop = self._stop[node]
            while j < stop and (final or (j + 1) * layout.chunk_elems <= self._filled.get(node, 0)):
                jobs.append((f"{node}/{layout.chunk_key(j)}", self._chunk(node, j)))
                j += 1
            self._next[node] = j
        if jobs:
            self._version.put_hashed(jobs, self._groups)

    def _chunk(self, node: str, j: int) -> list[tuple[memoryview, Any]]:
        layout = self._layouts[node]
        lo, hi = j * layout.chunk_elems, min(layout.length, (j + 1) * layout.chunk_elems)
        views = []
        for p in self._by_node[node]:
            a, b = max(lo, p.offset), min(hi, p.offset + p.numel)
            if a < b:
                data = bytes_of(p.name, self._shared[p.name], "").reshape(-1).view(np.uint8)
                size = layout.itemsize
                view = data[(a - p.offset) * size : (b - p.offset) * size].data
                views.append((view, self._hashers.get(p.name)))  # in order: chunks go in order
        if j == layout.nchunks - 1:
            pad = layout.nchunks * layout.chunk_bytes - layout.data_bytes
            if pad:
                views.append((memoryview(bytes(pad)), None))
        return views
