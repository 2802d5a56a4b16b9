"""Properties of the pure shard plan: a seeded per-epoch partition of the rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vcdl.data import shard_indices, shard_plan
from vcdl.data.shards import chunks_touched
from vcdl.errors import DataError


@st.composite
def plans(draw: st.DrawFn, min_n: int = 1) -> tuple[int, int, int, int]:
    n = draw(st.integers(min_n, 2_000))
    shards = draw(st.integers(1, n))
    seed = draw(st.integers(0, 2**63 - 1))
    epoch = draw(st.integers(0, 10_000))
    return n, shards, seed, epoch


@settings(max_examples=200, deadline=None)
@given(plans())
def test_plan_is_a_partition_of_nearly_equal_parts(args: tuple[int, int, int, int]) -> None:
    n, shards, seed, epoch = args
    plan = shard_plan(n, shards, seed, epoch)
    assert len(plan) == shards
    sizes = [len(p) for p in plan]
    assert max(sizes) - min(sizes) <= 1
    assert min(sizes) >= 1
    every = np.concatenate(plan)
    assert every.dtype == np.int64
    assert np.array_equal(np.sort(every), np.arange(n))


@settings(max_examples=100, deadline=None)
@given(plans())
def test_plan_is_deterministic(args: tuple[int, int, int, int]) -> None:
    a, b = shard_plan(*args), shard_plan(*args)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@settings(max_examples=100, deadline=None)
@given(plans(min_n=10), st.integers(1, 10_000))
def test_other_epoch_gives_other_permutation(args: tuple[int, int, int, int], delta: int) -> None:
    n, shards, seed, epoch = args
    first = np.concatenate(shard_plan(n, shards, seed, epoch))
    other = np.concatenate(shard_plan(n, shards, seed, epoch + delta))
    assert not np.array_equal(first, other)


@settings(max_examples=100, deadline=None)
@given(plans(), st.data())
def test_shard_indices_is_the_plans_element(
    args: tuple[int, int, int, int], data: st.DataObject
) -> None:
    n, shards, seed, epoch = args
    shard = data.draw(st.integers(0, shards - 1))
    assert np.array_equal(shard_indices(n, shards, seed, epoch, shard), shard_plan(*args)[shard])


def test_seed_changes_the_plan() -> None:
    assert not np.array_equal(shard_plan(100, 4, 0, 0)[0], shard_plan(100, 4, 1, 0)[0])


@pytest.mark.parametrize(
    ("n", "shards", "seed", "epoch"),
    [(10, 0, 0, 0), (10, -1, 0, 0), (10, 11, 0, 0), (0, 1, 0, 0), (10, 2, -1, 0), (10, 2, 0, -1)],
)
def test_invalid_plan_raises(n: int, shards: int, seed: int, epoch: int) -> None:
    with pytest.raises(DataError):
        shard_plan(n, shards, seed, epoch)


@pytest.mark.parametrize("shard", [-1, 4, 100])
def test_shard_out_of_range_raises(shard: int) -> None:
    with pytest.raises(DataError, match="shard must be in"):
        shard_indices(100, 4, 0, 0, shard)


def test_non_integer_arguments_raise() -> None:
    with pytest.raises(TypeError):
        shard_plan(10.0, 2, 0, 0)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the blocks plan


@st.composite
def block_plans(draw: st.DrawFn, min_n: int = 1) -> tuple[int, int, int, int, int]:
    n, shards, seed, epoch = draw(plans(min_n))
    block = draw(st.integers(1, n + 5))
    return n, shards, seed, epoch, block


@settings(max_examples=200, deadline=None)
@given(block_plans())
def test_block_plan_visits_every_row_once_in_nearly_equal_parts(
    args: tuple[int, int, int, int, int],
) -> None:
    n, shards, seed, epoch, block = args
    plan = shard_plan(n, shards, seed, epoch, block=block)
    assert len(plan) == shards
    sizes = [len(p) for p in plan]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    every = np.concatenate(plan)
    assert every.dtype == np.int64
    assert np.array_equal(np.sort(every), np.arange(n))
    assert np.array_equal(shard_indices(n, shards, seed, epoch, shards - 1, block=block), plan[-1])


@settings(max_examples=200, deadline=None)
@given(block_plans())
def test_block_plan_shard_reads_about_its_own_share(args: tuple[int, int, int, int, int]) -> None:
    """A shard lies in at most ceil(rows / block) + 2 chunks (its two ends, and the split's
    short last chunk); an epoch touches each chunk once plus one per shard boundary."""
    n, shards, seed, epoch, block = args
    plan = shard_plan(n, shards, seed, epoch, block=block)
    for rows in plan:
        assert chunks_touched(rows, block) <= -(-len(rows) // block) + 2
    total = sum(chunks_touched(rows, block) for rows in plan)
    assert total <= -(-n // block) + shards - 1


@settings(max_examples=100, deadline=None)
@given(block_plans(min_n=10), st.integers(1, 10_000))
def test_block_plan_order_is_new_every_epoch(
    args: tuple[int, int, int, int, int], delta: int
) -> None:
    n, shards, seed, epoch, block = args
    first = np.concatenate(shard_plan(n, shards, seed, epoch, block=block))
    again = np.concatenate(shard_plan(n, shards, seed, epoch, block=block))
    other = np.concatenate(shard_plan(n, shards, seed, epoch + delta, block=block))
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 50), st.integers(2, 40), st.integers(0, 2**32))
def test_block_plan_keeps_each_block_together(blocks: int, block: int, seed: int) -> None:
    """Concatenated, the plan is the blocks one after another, each block's rows shuffled."""
    n = blocks * block
    order = np.concatenate(shard_plan(n, 1, seed, 0, block=block))
    runs = order.reshape(blocks, block) // block
    assert (runs == runs[:, :1]).all()
    assert sorted(runs[:, 0]) == list(range(blocks))


def test_block_plan_rejects_a_zero_block() -> None:
    with pytest.raises(DataError, match="block"):
        shard_plan(10, 2, 0, 0, block=0)
