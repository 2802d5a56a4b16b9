"""The fleet model's simulator (benchmarks/fleetmodel/sim.py): bounds, monotony, closed forms."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.fleetmodel.costs import OWN_MERGE_WAIT_S, costs_for, merge_seconds
from benchmarks.fleetmodel.sim import Costs, Fleet, simulate

ZERO = Costs(worker_cpu_s=0, worker_cpu_s_per_gb=0, api_s=0, driver_s=0, ledger_s=0, merge_s=0)


def _costs(merge: float, worker: float = 0.3, driver: float = 0.05) -> Costs:
    return Costs(
        worker_cpu_s=worker,
        worker_cpu_s_per_gb=1.0,
        api_s=0.03,
        driver_s=driver,
        ledger_s=0.005,
        merge_s=merge,
        publish_s=0.02,
        barrier_s=0.2,
    )


fleets = st.builds(
    Fleet,
    workers=st.integers(1, 24),
    attempt_s=st.floats(1.0, 60.0),
    model_gb=st.floats(0.0, 1.0),
    mergers=st.integers(1, 8),
    shared_cores=st.one_of(st.none(), st.sampled_from([1.0, 2.0, 4.0])),
    attempt_cv=st.sampled_from([0.0, 0.3]),
    preempt_per_hour=st.sampled_from([0.0, 30.0]),
    replace_s=st.just(5.0),
    epochs=st.integers(1, 2),
    shards_per_worker=st.integers(1, 3),
    seed=st.integers(0, 3),
)


@settings(max_examples=40, deadline=None)
@given(fleet=fleets, merge=st.floats(0.0, 2.0))
def test_utilization_is_a_fraction_and_every_shard_merges(fleet: Fleet, merge: float) -> None:
    out = simulate(fleet, _costs(merge))
    assert 0.0 <= out.utilization <= 1.0 + 1e-9
    assert out.merged == fleet.epochs * fleet.shards_per_worker * fleet.workers


@settings(max_examples=30, deadline=None)
@given(
    workers=st.integers(1, 32),
    attempt_s=st.floats(1.0, 60.0),
    merge=st.floats(0.0, 3.0),
    k=st.integers(1, 8),
)
def test_more_mergers_never_lower_throughput(
    workers: int, attempt_s: float, merge: float, k: int
) -> None:
    """Fixed attempt times, machines of their own: K + 1 mergers finish no later than K."""
    fleet = Fleet(workers=workers, attempt_s=attempt_s, model_gb=0.1, mergers=k)
    more = dataclasses.replace(fleet, mergers=k + 1)
    # publish_s is paid from K = 2 on: from K = 1 the comparison starts past it.
    costs = dataclasses.replace(_costs(merge), publish_s=0.0)
    a, b = simulate(fleet, costs), simulate(more, costs)
    assert b.merges_per_s >= a.merges_per_s * (1 - 1e-9)
    assert b.utilization >= a.utilization - 1e-9


@pytest.mark.parametrize("shared", [None, 2.0])
def test_zero_costs_keep_every_worker_busy(shared: float | None) -> None:
    out = simulate(Fleet(workers=64, attempt_s=30.0, model_gb=0.1, shared_cores=shared), ZERO)
    assert out.utilization == pytest.approx(1.0)
    assert out.wall_s == pytest.approx(4 * 30.0)


def test_one_worker_matches_the_closed_form() -> None:
    """One slot, A attempts in one epoch: each pays the API, its CPU, and waits for its
    previous result's merge (capped) beyond the API's time; the run ends with the last merge."""
    c = _costs(merge=0.7, worker=0.4, driver=0.1)
    a, t, gb = 5, 20.0, 0.5
    out = simulate(Fleet(workers=1, attempt_s=t, model_gb=gb, epochs=1, shards_per_worker=a), c)
    cpu = c.worker_cpu_s + c.worker_cpu_s_per_gb * gb + c.ledger_s
    wait = max(0.0, min(c.own_merge_wait_s, c.driver_s + c.merge_s - c.api_s))
    wall = a * (c.api_s + cpu + t) + (a - 1) * wait + c.driver_s + c.merge_s
    assert out.wall_s == pytest.approx(wall)
    assert out.utilization == pytest.approx(a * t / wall)


def test_shared_cores_stretch_what_one_core_each_does_not() -> None:
    fleet = Fleet(workers=64, attempt_s=30.0, model_gb=0.1)
    c = _costs(merge=0.1, worker=0.5)
    own = simulate(fleet, c)
    shared = simulate(dataclasses.replace(fleet, shared_cores=2.0), c)
    assert shared.utilization < own.utilization - 0.05
    assert shared.mean_overhead_s > own.mean_overhead_s


def test_a_seed_gives_the_same_run_and_preemptions_cost() -> None:
    fleet = Fleet(
        workers=16, attempt_s=30.0, model_gb=0.1, attempt_cv=0.3, preempt_per_hour=20.0, seed=7
    )
    c = _costs(merge=0.3)
    assert simulate(fleet, c) == simulate(fleet, c)
    calm = simulate(dataclasses.replace(fleet, preempt_per_hour=0.0), c)
    rough = simulate(fleet, c)
    assert rough.preempted > 0 and calm.preempted == 0
    assert rough.utilization < calm.utilization


def test_the_wait_cap_is_vcdls() -> None:
    # Read, not imported: importing vcdl.worker takes seconds.
    source = (Path(__file__).resolve().parents[2] / "vcdl/worker/slots.py").read_text()
    assert re.search(r"^OWN_MERGE_WAIT = ([\d.]+)$", source, re.M)[1] == str(OWN_MERGE_WAIT_S)  # type: ignore[index]


def test_merges_by_size_and_precision() -> None:
    assert merge_seconds(25e6) == pytest.approx(0.47)
    assert merge_seconds(25e6, "int8") == pytest.approx(0.62)
    assert merge_seconds(1e6) < merge_seconds(5e7) < merge_seconds(1e8) < merge_seconds(1e9)
    with pytest.raises(ValueError):
        merge_seconds(1e10)
    with pytest.raises(ValueError):
        costs_for(25e6, "bf16")
