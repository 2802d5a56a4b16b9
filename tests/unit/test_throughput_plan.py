"""Throughput read off the attempts that trained, an epoch's plan, and a result's weight by size."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vcdl.driver.merge_plan import SIZE_SHARE, Candidate, blend_of
from vcdl.driver.throughput import (
    epoch_plan,
    pinned_address,
    share_of,
    throughput_by_worker,
    worker_key,
)
from vcdl.ledger import Attempt


def attempt(
    worker: str,
    samples: int | None,
    seconds: float | None,
    state: str = "finished",
    name: str | None = None,
):
    return Attempt(
        run="r",
        subtask_id=1,
        epoch=0,
        shard=0,
        number=1,
        worker=worker,
        base_version=0,
        state=state,
        samples=samples,
        train_seconds=seconds,
        worker_name=name,
    )


def test_throughput_is_samples_over_training_seconds_of_finished_attempts() -> None:
    got = throughput_by_worker(
        [
            attempt("a", 100, 1.0),
            attempt("a", 300, 1.0),
            attempt("b", 50, 2.0),
            attempt("b", 25, 1.0, state="merged"),
            attempt("b", 1000, 1.0, state="killed"),  # trained, recorded nothing final
            attempt("c", 0, 1.0),
            attempt("d", 10, None),
        ]
    )
    assert got == {"a": 200.0, "b": 25.0}
    resumed = attempt("a", 5000, 1.0)
    resumed.resumed_from = "other"  # its samples count another worker's checkpoint
    assert throughput_by_worker([attempt("a", 100, 1.0), resumed]) == {"a": 100.0}


def test_a_worker_is_measured_by_its_name_across_addresses_by_its_address_before_names() -> None:
    # Worker "1" on two addresses (a resumed driver's new cluster): one worker, one pace.
    got = throughput_by_worker(
        [
            attempt("tcp://h:1001", 100, 1.0, name="1"),
            attempt("tcp://h:2002", 300, 1.0, name="1"),
            attempt("tcp://h:1000", 50, 1.0, name="0"),
            attempt("tcp://old", 10, 1.0),  # recorded before names (ledger migration 0014)
        ]
    )
    assert got == {"1": 200.0, "0": 50.0, "tcp://old": 10.0}
    assert worker_key(attempt("tcp://a", 1, 1.0)) == "tcp://a"
    assert worker_key(attempt("tcp://a", 1, 1.0, name="spot-3")) == "spot-3"


def test_a_pin_finds_its_worker_by_name_on_a_new_address_or_by_its_address() -> None:
    fleet = {"tcp://h:2000": "0", "tcp://h:2001": "1"}
    assert pinned_address("1", fleet) == "tcp://h:2001"
    assert pinned_address("0", fleet) == "tcp://h:2000"
    # A plan recorded before names pinned addresses: one still there is itself.
    assert pinned_address("tcp://h:2001", fleet) == "tcp://h:2001"
    # Gone (name and address): unpinned, the shard runs anywhere.
    assert pinned_address("2", fleet) is None
    assert pinned_address("tcp://h:1000", fleet) is None
    assert pinned_address("0", {}) is None


def test_a_plan_pins_shards_round_robin_and_sizes_them_by_throughput() -> None:
    sizes, pinned = epoch_plan(
        1000, 4, ["tcp://b", "tcp://a"], {"tcp://a": 300.0, "tcp://b": 100.0}
    )
    assert pinned == ["tcp://a", "tcp://b", "tcp://a", "tcp://b"]
    assert sizes == [375, 125, 375, 125]


def test_a_worker_with_more_shards_gets_smaller_ones_so_workers_end_together() -> None:
    plan = epoch_plan(900, 3, ["a", "b"], {"a": 100.0, "b": 100.0})
    assert plan == ([225, 450, 225], ["a", "b", "a"])
    # An unmeasured worker counts at the median of the measured ones.
    plan = epoch_plan(1200, 3, ["a", "b", "c"], {"a": 300.0, "c": 100.0})
    assert plan == ([600, 400, 200], ["a", "b", "c"])


def test_a_plan_with_nothing_measured_is_the_even_one() -> None:
    assert epoch_plan(10, 3, ["x", "y"], {"gone": 5.0}) is None
    # One measured: the other counts at the median (of one); x's two shards share its pace.
    assert epoch_plan(10, 3, ["x", "y"], {"x": 5.0}) == ([3, 5, 2], ["x", "y", "x"])
    with pytest.raises(ValueError):
        epoch_plan(10, 3, [], {})


def test_share_of_an_even_plan_is_none_and_of_a_sized_one_relative_to_the_mean() -> None:
    assert share_of(None, 0) is None
    assert share_of([300, 100], 0) == 1.5
    assert share_of([300, 100], 1) == 0.5


alphas = st.floats(0.0, 1.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(alphas, st.one_of(st.none(), st.floats(0.0, 1.0)))
def test_without_a_size_share_the_blend_is_the_even_plans_to_the_bit(
    alpha: float, fraction: float | None
) -> None:
    expected = alpha if fraction is None else 1.0 - (1.0 - alpha) * fraction
    assert blend_of(alpha, fraction, None) == expected


@settings(max_examples=200, deadline=None)
@given(alphas, st.floats(0.01, 8.0), st.one_of(st.none(), st.floats(0.0, 1.0)))
def test_a_sized_result_weighs_by_its_share_at_most_replacing_the_head(
    alpha: float, share: float, fraction: float | None
) -> None:
    blend = blend_of(alpha, fraction, share)
    weight = (1.0 - alpha) * (1.0 if fraction is None else fraction) * share
    assert 0.0 <= blend <= 1.0
    assert blend == pytest.approx(1.0 - min(1.0, weight))


def test_a_candidate_reads_its_share_from_the_result_group() -> None:
    a = attempt("w", 40, 1.0)
    a.id = "x"
    even = Candidate.of(a, {"planned_samples": 40})
    sized = Candidate.of(a, {"planned_samples": 40, SIZE_SHARE: 2.0})
    assert even.size_share is None and even.blend_alpha(0.75) == 0.75
    assert sized.size_share == 2.0 and sized.blend_alpha(0.75) == 0.5
