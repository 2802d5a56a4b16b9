"""The head's flat arrays cut into K parameter ranges for K mergers, pure (``merge.mergers``).

A version group packs its tensors into one flat array per dtype, each cut
into chunks (:mod:`vcdl.store.layout`); a chunk is one object in the store,
written whole by one writer. :func:`plan_ranges` cuts the chunks of all the
arrays, in order, into at most K contiguous runs of about equal bytes, so
that K mergers (:mod:`vcdl.driver.sharded`) each write whole chunks of
their own and no chunk twice. Every element is in exactly one range, at
chunk boundaries, and the same inputs always give the same ranges.

:func:`range_pieces` says which tensors (and which elements of each, in C
order) a range covers: a tensor that crosses a range's boundary is a
*straddling* tensor, of which each merger has a part; its checksum, which
covers all its bytes, is then the driver's to compute
(:func:`straddling`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ArrayChunks:
    """One flat array's size and chunking (what :class:`~vcdl.store.arrays.ArrayLayout` says)."""

    node: str
    length: int  # elements
    chunk_elems: int
    itemsize: int

    @property
    def nchunks(self) -> int:
        return -(-self.length // self.chunk_elems)

    def chunk_bytes(self, j: int) -> int:
        """The data bytes of chunk ``j`` (the last one may hold fewer elements)."""
        return (min(self.length, (j + 1) * self.chunk_elems) - j * self.chunk_elems) * self.itemsize


@dataclass(frozen=True)
class Span:
    """Chunks ``[first, stop)`` of one array: its elements ``[start, end)``."""

    node: str
    first: int
    stop: int
    start: int
    end: int


@dataclass(frozen=True)
class MergeRange:
    """What one merger writes: whole chunks of one or more arrays."""

    index: int
    spans: tuple[Span, ...]

    def elements(self) -> int:
        return sum(s.end - s.start for s in self.spans)


def plan_ranges(arrays: Sequence[ArrayChunks], k: int) -> list[MergeRange]:
    """The arrays' chunks cut into at most ``k`` ranges of about equal bytes, in order.

    A chunk goes to the range its middle byte falls in (of ``k`` equal
    shares of all the bytes), so the ranges are contiguous runs of chunks;
    empty ones (fewer chunks than ``k``) are left out, and the rest numbered
    from 0. Deterministic: a function of the arrays and ``k`` only.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    total = sum(a.length * a.itemsize for a in arrays)
    owner: list[tuple[ArrayChunks, int, int]] = []  # (array, chunk, range)
    at = 0
    for a in arrays:
        for j in range(a.nchunks):
            size = a.chunk_bytes(j)
            r = min(k - 1, (2 * at + size) * k // (2 * total)) if total else 0
            owner.append((a, j, r))
            at += size
    spans: dict[int, list[Span]] = {}
    for a, j, r in owner:
        got = spans.setdefault(r, [])
        last = got[-1] if got else None
        end = min(a.length, (j + 1) * a.chunk_elems)
        if last is not None and last.node == a.node and last.stop == j:
            got[-1] = Span(a.node, last.first, j + 1, last.start, end)
        else:
            got.append(Span(a.node, j, j + 1, j * a.chunk_elems, end))
    return [MergeRange(i, tuple(spans[r])) for i, r in enumerate(sorted(spans))]


@dataclass(frozen=True)
class Placed:
    """One tensor in its array: ``numel`` elements from ``offset`` of array ``node``."""

    name: str
    node: str
    offset: int
    numel: int


@dataclass(frozen=True)
class Piece:
    """Elements ``[lo, hi)`` of tensor ``name`` (flattened, C order) in one range."""

    name: str
    lo: int
    hi: int
    whole: bool


def range_pieces(tensors: Sequence[Placed], r: MergeRange) -> list[Piece]:
    """The parts of ``tensors`` (in their order) that range ``r`` covers."""
    out = []
    for t in tensors:
        for s in r.spans:
            if s.node != t.node:
                continue
            lo, hi = max(t.offset, s.start), min(t.offset + t.numel, s.end)
            if lo < hi:
                out.append(Piece(t.name, lo - t.offset, hi - t.offset, hi - lo == t.numel))
    return out


def straddling(tensors: Sequence[Placed], ranges: Sequence[MergeRange]) -> set[str]:
    """The tensors that more than one range has a part of."""
    return {t.name for t in tensors if sum(1 for r in ranges for p in range_pieces([t], r)) > 1}
