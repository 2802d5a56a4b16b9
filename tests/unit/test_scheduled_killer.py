"""ScheduledKiller on real processes: the same seeded kills, never a dead process twice."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from vcdl.chaos import ChaosEvent, ScheduledKiller


@contextmanager
def _sleepers(n: int) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """``n`` real processes that sleep, killed and reaped on exit."""
    procs = {
        f"p{i}": subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        for i in range(n)
    }
    try:
        yield procs
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


@pytest.fixture
def sleepers() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    with _sleepers(2) as procs:
        yield procs


def _run(killer: ScheduledKiller) -> None:
    killer.start()
    killer.start_clock()
    killer.join(timeout=10)
    assert not killer.is_alive()


def test_a_killed_process_that_lingers_is_not_a_victim_again(
    sleepers: dict[str, subprocess.Popen[bytes]],
) -> None:
    # Nobody reaps the children during the run: a killed one stays a zombie
    # with its pid listed, as a Dask worker stays registered for a moment.
    pids = {label: p.pid for label, p in sleepers.items()}
    events = [ChaosEvent(at=0.0, kind="kill"), ChaosEvent(at=0.05, kind="kill")]
    killer = ScheduledKiller(events, lambda: pids, seed=3, min_victims=1)
    _run(killer)
    assert [r.outcome for r in killer.records] == ["sent", "sent"]
    assert {r.pid for r in killer.records} == set(pids.values())  # both, once each
    assert killer.kills() == 2
    for p in sleepers.values():
        assert p.wait(timeout=5) == -9


def test_it_skips_when_fewer_than_min_victims_are_up(
    sleepers: dict[str, subprocess.Popen[bytes]],
) -> None:
    pids = {label: p.pid for label, p in sleepers.items()}
    events = [ChaosEvent(at=0.0, kind="kill"), ChaosEvent(at=0.05, kind="kill")]
    killer = ScheduledKiller(events, lambda: pids, seed=3, min_victims=2)
    _run(killer)
    assert [r.outcome for r in killer.records] == ["sent", "skipped: 1 up"]
    assert killer.kills() == 1


def test_the_same_seed_picks_the_same_victims() -> None:
    picks = []
    for _ in range(2):
        with _sleepers(3) as procs:
            labels = {label: p.pid for label, p in procs.items()}
            killer = ScheduledKiller(
                [ChaosEvent(at=0.0, kind="kill")], lambda labels=labels: labels, seed=11
            )
            _run(killer)
            picks.append(killer.records[0].worker)
    assert picks[0] == picks[1]
