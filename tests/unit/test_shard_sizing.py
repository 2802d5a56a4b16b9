"""Shard sizes by throughput (vcdl.data.sizing) and the shard plan cut by them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vcdl.data import shard_indices, shard_plan
from vcdl.data.sizing import (
    even_sizes,
    planned_times,
    shard_sizes,
    size_share,
    time_spread_bound,
)
from vcdl.errors import DataError

speeds = st.floats(0.01, 1000.0, allow_nan=False, allow_infinity=False)


@st.composite
def fleets(draw: st.DrawFn) -> tuple[int, list[float]]:
    tps = draw(st.lists(speeds, min_size=1, max_size=16))
    n = draw(st.integers(len(tps), 200_000))
    return n, tps


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_sizes_cover_the_epoch_and_planned_times_are_within_the_stated_factor(
    fleet: tuple[int, list[float]],
) -> None:
    n, tps = fleet
    sizes = shard_sizes(n, tps)
    assert sum(sizes) == n
    assert all(s >= 1 for s in sizes)
    times = planned_times(sizes, tps)
    bound = time_spread_bound(n, tps)
    assert max(times) <= bound * min(times) * (1 + 1e-12)
    # The rule of thumb the docs state: shares of 9 rows or more -> within 1.25x.
    if min(n * t / sum(tps) for t in tps) >= 9:
        assert max(times) <= 1.25 * min(times) * (1 + 1e-12)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 5_000), st.integers(1, 16), speeds)
def test_equal_or_unmeasured_throughputs_give_the_even_plans_sizes(
    n: int, shards: int, t: float
) -> None:
    shards = min(shards, n)
    plan = [len(p) for p in shard_plan(n, shards, 0, 0)]
    assert even_sizes(n, shards) == plan
    assert shard_sizes(n, [t] * shards) == plan
    assert shard_sizes(n, [None] * shards) == plan


def test_an_unmeasured_worker_gets_the_fleets_median() -> None:
    # Median of (4, 1, 2) is 2: the unmeasured shard is sized like the 2.
    assert shard_sizes(900, [4.0, None, 1.0, 2.0]) == [400, 200, 100, 200]


def test_a_tiny_share_still_gets_a_row() -> None:
    sizes = shard_sizes(10, [1000.0, 0.01])
    assert sizes == [9, 1]
    assert time_spread_bound(10, [1000.0, 0.01]) == float("inf")


@pytest.mark.parametrize("bad", [[0.0, 1.0], [-1.0], [float("inf")], [float("nan")]])
def test_a_broken_throughput_is_refused(bad: list[float]) -> None:
    with pytest.raises(DataError, match="throughput"):
        shard_sizes(100, bad)


def test_more_shards_than_rows_is_refused() -> None:
    with pytest.raises(DataError, match="shards"):
        shard_sizes(2, [1.0, 1.0, 1.0])


def test_size_share_is_relative_to_the_mean_shard() -> None:
    assert size_share(250, 1000, 4) == 1.0
    assert size_share(500, 1000, 4) == 2.0
    with pytest.raises(DataError):
        size_share(0, 1000, 4)


@settings(max_examples=150, deadline=None)
@given(fleets(), st.integers(0, 2**32), st.integers(0, 100), st.sampled_from([None, 1, 7, 64]))
def test_a_plan_cut_by_sizes_trains_every_index_exactly_once(
    fleet: tuple[int, list[float]], seed: int, epoch: int, block: int | None
) -> None:
    n, tps = fleet
    n = min(n, 5_000)
    tps = tps[:n]
    sizes = shard_sizes(n, tps)
    plan = shard_plan(n, len(sizes), seed, epoch, block=block, sizes=sizes)
    assert [len(p) for p in plan] == sizes
    everything = np.concatenate(plan)
    assert np.array_equal(np.sort(everything), np.arange(n))
    # The same order as the even plan, cut elsewhere; each shard recomputable alone.
    even = np.concatenate(shard_plan(n, len(sizes), seed, epoch, block=block))
    assert np.array_equal(everything, even)
    last = len(sizes) - 1
    assert np.array_equal(
        shard_indices(n, len(sizes), seed, epoch, last, block=block, sizes=sizes), plan[last]
    )


@pytest.mark.parametrize("sizes", [[5, 4], [5, 6], [10, 0], [3, 3, 4]])
def test_sizes_that_do_not_cut_the_epoch_are_refused(sizes: list[int]) -> None:
    with pytest.raises(DataError, match="sizes"):
        shard_plan(10, 2, 0, 0, sizes=sizes)
