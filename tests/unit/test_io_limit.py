"""The pure parts of benchmarks/io_limit.py (the machine's own limit for a merge).

Its decode must be the int8 codec's (a scale per row, rows of ``side``
elements, chunks that start and end anywhere in a row), and its split of the
version's chunks across K pipelines must cover each chunk exactly once.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.io_limit import Array, scaled_rows, split_ranges
from benchmarks.io_limit_modes import LIMIT_OF, LIMITS, limit_args


@settings(max_examples=60, deadline=None)
@given(
    side=st.integers(1, 9),
    rows=st.integers(1, 12),
    cut=st.tuples(st.integers(0, 200), st.integers(0, 200)),
    seed=st.integers(0, 2**16),
)
def test_scaled_rows_is_a_scale_per_row(
    side: int, rows: int, cut: tuple[int, int], seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (rows * side,), generator=gen, dtype=torch.int8)
    scales = torch.rand(rows, generator=gen)
    expect = (q.to(torch.float32).view(rows, side) * scales[:, None]).flatten()
    lo, hi = sorted(c % (rows * side + 1) for c in cut)
    got = scaled_rows(q[lo:hi], lo, scales, side)
    assert torch.equal(got, expect[lo:hi])


@given(n=st.integers(0, 50), k=st.integers(1, 8))
def test_split_ranges_cover_each_job_once_in_order(n: int, k: int) -> None:
    parts = split_ranges(list(range(n)), k)
    assert len(parts) == k
    assert [j for part in parts for j in part] == list(range(n))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


@given(length=st.integers(1, 10_000), chunk=st.integers(1, 3_000))
def test_chunk_ranges_cover_the_array(length: int, chunk: int) -> None:
    ranges = Array("float32", length, chunk).chunk_ranges()
    assert [j for j, _, _ in ranges] == list(range(len(ranges)))
    assert all(start == j * chunk and count == chunk for j, start, count in ranges)
    assert (len(ranges) - 1) * chunk < length <= len(ranges) * chunk


def test_each_merge_contender_has_a_limit_of_its_own_shape() -> None:
    assert set(LIMIT_OF.values()) <= set(LIMITS)
    for mode, lim in LIMIT_OF.items():
        args = limit_args(lim)
        assert args["pipelines"] == (2 if mode.startswith("sharded") else 1)
        assert args["source"] == ("result-int8" if mode.endswith("-int8") else "result")
        assert args["sha256"] is False
    assert limit_args("limit-sha256")["sha256"] is True
