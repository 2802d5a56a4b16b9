"""vcdl.driver.dispatch.dispatch_phases: where an attempt's time outside its body went."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vcdl.driver.dispatch import dispatch_phases


def clock(**marks: float | None) -> dict[str, float | None]:
    return {"dask_started": None, "prefetched": None, "slot_acquired": None, **marks}


def test_read_ahead_while_the_worker_trained_is_not_overhead() -> None:
    # Sent at 0 to a worker busy until 5; the spare thread started at 1, read
    # the rows by 1.5, waited for the slot until 5.1.
    c = clock(dask_started=1.0, body_started=1.2, prefetched=1.5, slot_acquired=5.1, body_ended=9.0)
    p = dispatch_phases(sent=0.0, ready=5.0, received=9.3, clock=c)
    assert p["prefetch"] == 0.0
    assert p["queued"] == pytest.approx(1.0 + 3.9)  # before Dask started it + slot wait
    assert p["scheduling"] == 0.0
    assert p["prefect"] == pytest.approx(0.2 + 0.3)


def test_read_ahead_of_a_free_worker_is_on_the_critical_path() -> None:
    # The worker was free at 2 (sent then): Dask started it at 2.1, the body
    # at 2.3, the rows were read by 2.4, the slot was free at once.
    c = clock(dask_started=2.1, body_started=2.3, prefetched=2.4, slot_acquired=2.4, body_ended=7.0)
    p = dispatch_phases(sent=2.0, ready=2.0, received=7.1, clock=c)
    assert p["prefetch"] == pytest.approx(0.1)
    assert p["queued"] == pytest.approx(0.0)
    assert p["scheduling"] == pytest.approx(0.1)
    assert p["prefect"] == pytest.approx(0.2 + 0.1)


def test_read_ahead_that_outlasts_the_previous_attempt_counts_from_the_free_moment() -> None:
    c = clock(dask_started=1.0, body_started=1.0, prefetched=5.5, slot_acquired=5.5, body_ended=9.0)
    p = dispatch_phases(sent=0.0, ready=5.0, received=9.0, clock=c)
    assert p["prefetch"] == pytest.approx(0.5)
    assert p["queued"] == pytest.approx(1.0 + 4.0)


def test_without_a_dask_thread_everything_is_dispatch() -> None:
    c = clock(body_started=1.0, body_ended=4.0)
    assert dispatch_phases(sent=0.0, ready=0.5, received=4.5, clock=c) == {"dispatch": 1.0}


def test_task_clock_without_read_ahead_marks() -> None:
    # A result from before read-ahead existed (no "prefetched"): nothing is prefetch.
    c = {"dask_started": 1.0, "body_started": 1.1, "body_ended": 3.0}
    p = dispatch_phases(sent=1.0, ready=1.0, received=3.2, clock=c)
    assert p["prefetch"] == 0.0 and p["queued"] == 0.0


def test_a_result_waiting_for_the_driver_is_not_prefects() -> None:
    # Done at 9.1 (the driver's client knew), taken by the epoch loop at 10.5
    # (it was merging others): 0.1 s after the body is Prefect's and Dask's.
    c = clock(dask_started=1.0, body_started=1.2, slot_acquired=1.2, body_ended=9.0)
    p = dispatch_phases(sent=1.0, ready=1.0, received=10.5, clock=c, arrived=9.1)
    assert p["prefect"] == pytest.approx(0.2 + 0.1)
    assert p["driver_queue"] == pytest.approx(1.4)
    # Without the mark the same wait is all "prefect", as before.
    q = dispatch_phases(sent=1.0, ready=1.0, received=10.5, clock=c)
    assert q["prefect"] == pytest.approx(0.2 + 1.5) and "driver_queue" not in q


@given(
    marks=st.lists(st.floats(0, 100), min_size=6, max_size=6),
    arrived=st.floats(-10, 110),
)
def test_the_driver_queue_splits_the_prefect_phase_without_losing_time(
    marks: list[float], arrived: float
) -> None:
    sent, begun, started, ended, received, ready = sorted(marks)
    c = clock(dask_started=begun, body_started=started, body_ended=ended)
    whole = dispatch_phases(sent, ready, received, c)
    split = dispatch_phases(sent, ready, received, c, arrived=arrived)
    assert split["driver_queue"] >= 0 and split["prefect"] >= 0
    assert split["prefect"] + split["driver_queue"] == pytest.approx(whole["prefect"])
    assert {k: v for k, v in split.items() if k not in ("prefect", "driver_queue")} == {
        k: v for k, v in whole.items() if k != "prefect"
    }
