"""Properties of the pure merge range plan: K mergers' ranges of the head's chunks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vcdl.driver.merge_ranges import (
    ArrayChunks,
    MergeRange,
    Placed,
    plan_ranges,
    range_pieces,
    straddling,
)


@st.composite
def layouts(draw: st.DrawFn) -> tuple[list[ArrayChunks], list[Placed], int]:
    """Arrays of packed tensors (as a version group has them), and K."""
    arrays, placed = [], []
    for a in range(draw(st.integers(1, 4))):
        sizes = draw(st.lists(st.integers(0, 500), min_size=1, max_size=8))
        length = sum(sizes)
        chunk = draw(st.integers(1, max(1, length)))
        arrays.append(ArrayChunks(f"a{a}", length, chunk, draw(st.sampled_from([1, 2, 4, 8]))))
        at = 0
        for i, n in enumerate(sizes):
            placed.append(Placed(f"a{a}.t{i}", f"a{a}", at, n))
            at += n
    return arrays, placed, draw(st.integers(1, 20))


def elements(r: MergeRange, node: str) -> list[int]:
    return [e for s in r.spans if s.node == node for e in range(s.start, s.end)]


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_ranges_cover_every_element_once_at_chunk_boundaries(
    args: tuple[list[ArrayChunks], list[Placed], int],
) -> None:
    arrays, _, k = args
    ranges = plan_ranges(arrays, k)
    assert 1 <= len(ranges) <= k or sum(a.length for a in arrays) == 0
    assert [r.index for r in ranges] == list(range(len(ranges)))
    assert all(r.spans for r in ranges)  # no empty range
    for a in arrays:
        got = sorted(e for r in ranges for e in elements(r, a.node))
        assert got == list(range(a.length))
        for r in ranges:
            for s in r.spans:
                if s.node == a.node:
                    assert s.start == s.first * a.chunk_elems
                    assert s.end == min(a.length, s.stop * a.chunk_elems)
    # In order: the ranges are consecutive runs of the arrays' chunks.
    order = [(a.node, j) for a in arrays for j in range(a.nchunks)]
    walked = [(s.node, j) for r in ranges for s in r.spans for j in range(s.first, s.stop)]
    assert walked == order


@settings(max_examples=200, deadline=None)
@given(layouts())
def test_ranges_are_deterministic_and_about_equal(
    args: tuple[list[ArrayChunks], list[Placed], int],
) -> None:
    arrays, _, k = args
    ranges = plan_ranges(arrays, k)
    assert ranges == plan_ranges(list(arrays), k)
    total = sum(a.length * a.itemsize for a in arrays)
    biggest = max((a.chunk_elems * a.itemsize for a in arrays), default=0)
    for r in ranges:
        size = sum(
            (s.end - s.start) * next(a.itemsize for a in arrays if a.node == s.node)
            for s in r.spans
        )
        assert size <= total / k + biggest


@settings(max_examples=200, deadline=None)
@given(layouts())
def test_pieces_split_each_tensor_once_and_name_the_straddling_ones(
    args: tuple[list[ArrayChunks], list[Placed], int],
) -> None:
    arrays, placed, k = args
    ranges = plan_ranges(arrays, k)
    split = straddling(placed, ranges)
    for t in placed:
        pieces = [p for r in ranges for p in range_pieces([t], r)]
        covered = sorted(e for p in pieces for e in range(p.lo, p.hi))
        assert covered == list(range(t.numel))
        assert (t.name in split) == (len(pieces) > 1)
        assert all(p.whole == (p.hi - p.lo == t.numel) for p in pieces)


def test_one_merger_has_one_range_of_everything() -> None:
    arrays = [ArrayChunks("float32", 10, 3, 4), ArrayChunks("int64", 1, 1, 8)]
    (only,) = plan_ranges(arrays, 1)
    assert [(s.node, s.first, s.stop, s.start, s.end) for s in only.spans] == [
        ("float32", 0, 4, 0, 10),
        ("int64", 0, 1, 0, 1),
    ]


def test_fewer_chunks_than_mergers_leave_no_empty_range() -> None:
    ranges = plan_ranges([ArrayChunks("float32", 10, 5, 4)], 8)
    assert [[(s.first, s.stop) for s in r.spans] for r in ranges] == [[(0, 1)], [(1, 2)]]
