"""vcdl.driver.dispatch.dispatch_phases: where an attempt's time outside its body went."""

from __future__ import annotations

import pytest

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
