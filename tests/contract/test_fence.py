"""Contract suite for the lease's fencing token, on SQLite and PostgreSQL.

A driver's ledger is fenced with the lease generation it took
(vcdl/ledger/fence.py): once another driver has taken the run over, every
write the first one makes is refused with :class:`LeaseLost` and changes
nothing. The end-to-end case (a driver paused past its lease with SIGSTOP)
is tests/chaos/test_fencing.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import select

from vcdl.errors import LeaseHeld, LeaseLost
from vcdl.ledger import Ledger
from vcdl.ledger.merging import FoldItem
from vcdl.ledger.rows import RUN


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger(request: pytest.FixtureRequest) -> Iterator[Ledger]:
    url: str = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    led = Ledger(url)
    yield led
    led.close()


def new_run(ledger: Ledger, name: str = "f1") -> None:
    ledger.create_run(name, json.dumps({"lr": 0.1}), f"{name}/v0", "sum0")
    ledger.ensure_subtasks(name, 0, 4)


def finished(ledger: Ledger, name: str, shard: int, lease: int | None = None) -> str:
    a = ledger.start_attempt(name, 0, shard, "w", lease=lease)
    ledger.finish_attempt(a.id, state="finished", result_uri=f"{name}/r-{a.id}")
    return a.id


def test_generation_rises_only_when_the_lease_changes_hands(ledger: Ledger) -> None:
    new_run(ledger)
    assert ledger.get_run("f1").lease_generation == 0
    assert ledger.acquire_lease("f1", "d1", 60) == 1
    assert ledger.acquire_lease("f1", "d1", 60) == 1  # its own again: same token
    ledger.renew_lease("f1", "d1", 1, 60)
    with pytest.raises(LeaseHeld):
        ledger.acquire_lease("f1", "d2", 60)
    ledger.release_lease("f1", "d1")
    assert ledger.acquire_lease("f1", "d2", 60) == 2
    ledger.release_lease("f1", "d2")
    # Expired and taken by another: a new generation, and the old holder is fenced.
    assert ledger.acquire_lease("f1", "d3", 0.05) == 3
    time.sleep(0.1)
    assert ledger.acquire_lease("f1", "d4", 60) == 4
    assert ledger.get_run("f1").lease_generation == 4


def test_renewal_after_a_takeover_is_refused_and_names_the_new_driver(ledger: Ledger) -> None:
    new_run(ledger)
    gen = ledger.acquire_lease("f1", "paused-driver", 0.05)
    time.sleep(0.1)
    ledger.acquire_lease("f1", "new-driver", 60)
    with pytest.raises(LeaseLost, match="new-driver") as err:
        ledger.renew_lease("f1", "paused-driver", gen, 60)
    assert "lease generation 2" in str(err.value) and "held 1" in str(err.value)
    assert ledger.get_run("f1").lease_owner == "new-driver"
    # Let go and taken by nobody since: the old token is still refused.
    ledger.release_lease("f1", "new-driver")
    with pytest.raises(LeaseLost):
        ledger.renew_lease("f1", "new-driver", 2, 60)


def test_an_expired_lease_nobody_took_is_renewed(ledger: Ledger) -> None:
    new_run(ledger)
    gen = ledger.acquire_lease("f1", "slow", 0.05)
    time.sleep(0.1)
    ledger.renew_lease("f1", "slow", gen, 60)
    fenced = ledger.fenced("f1", gen)
    fenced.update_run("f1", state="running")
    assert ledger.get_run("f1").state == "running"


def _driver_writes(fenced: Ledger, attempt_id: str, other_id: str) -> list[Callable[[], object]]:
    """Every kind of write a driver makes, each on its own."""
    return [
        lambda: fenced.update_run("f1", state="running"),
        lambda: fenced.update_run("f1", epochs_completed=1),
        lambda: fenced.ensure_subtasks("f1", 1, 4),
        lambda: fenced.commit_merge(
            "f1", attempt_id, expected_head=0, uri="f1/v1", checksum="s1", alpha=0.5, staleness=0
        ),
        lambda: fenced.commit_fold(
            "f1",
            [FoldItem(attempt_id, 0.5, 0, "f1/v1"), FoldItem(other_id, 0.5, 0, "f1/v2")],
            expected_head=0,
            checksum="s2",
        ),
        lambda: fenced.mark_pruned("f1", [0]),
        lambda: fenced.finish_attempt(attempt_id, state="rejected", reason="late"),
        lambda: fenced.abandon_attempt(attempt_id, state="killed", reason="gone"),
        lambda: fenced.start_attempt("f1", 0, 3, "w"),
        lambda: fenced.record_evaluation("f1", 0, 0, "test", 0.5, 1.0, 10),
    ]


def test_every_write_of_a_fenced_out_driver_is_refused_and_changes_nothing(
    ledger: Ledger,
) -> None:
    new_run(ledger)
    old = ledger.acquire_lease("f1", "paused", 0.05)
    fenced = ledger.fenced("f1", old)
    attempt_id, other_id = finished(ledger, "f1", 0), finished(ledger, "f1", 1)
    time.sleep(0.1)
    ledger.acquire_lease("f1", "resumer", 60)

    def snapshot() -> tuple[object, ...]:
        run = ledger.get_run("f1")
        return (
            run.state,
            run.head_version,
            run.epochs_completed,
            [(s.epoch, s.shard, s.state, s.attempts) for s in ledger.subtasks("f1")],
            [(a.id, a.state) for a in ledger.attempts("f1")],
            [(v.number, v.pruned_at) for v in ledger.versions("f1")],
            len(ledger.evaluations("f1")),
        )

    before = snapshot()
    for write in _driver_writes(fenced, attempt_id, other_id):
        with pytest.raises(LeaseLost, match="resumer"):
            write()
    with pytest.raises(LeaseLost):
        fenced.check_lease("f1")
    # A worker's claim made under the old lease is refused the same way.
    with pytest.raises(LeaseLost):
        ledger.start_attempt("f1", 0, 2, "w", lease=old)
    assert snapshot() == before
    # Reads still work, and the new driver's writes go through.
    assert fenced.head("f1").number == 0
    new = ledger.fenced("f1", old + 1)
    new.commit_merge(
        "f1", attempt_id, expected_head=0, uri="f1/v1", checksum="s1", alpha=0.5, staleness=0
    )
    assert ledger.get_run("f1").head_version == 1


def test_the_current_drivers_writes_all_pass(ledger: Ledger) -> None:
    new_run(ledger)
    gen = ledger.acquire_lease("f1", "d", 60)
    fenced = ledger.fenced("f1", gen)
    a = finished(fenced, "f1", 0, lease=gen)
    b = finished(fenced, "f1", 1, lease=gen)
    fenced.check_lease("f1")
    fenced.update_run("f1", state="running")
    fenced.commit_fold(
        "f1",
        [FoldItem(a, 0.5, 0, "f1/v1"), FoldItem(b, 0.5, 0, "f1/v2")],
        expected_head=0,
        checksum="s2",
    )
    fenced.record_evaluation("f1", 2, 0, "test", 0.5, 1.0, 10)
    fenced.mark_pruned("f1", [0])
    assert ledger.get_run("f1").head_version == 2
    # A fenced view of a fenced view fences with the newer generation only.
    with pytest.raises(LeaseLost):
        fenced.fenced("f1", gen + 1).check_lease("f1")
    with pytest.raises(LeaseLost):
        fenced.fenced("f1", gen + 1).update_run("f1", epochs_completed=1)


@pytest.mark.postgres
def test_a_takeover_waits_for_a_fenced_write_in_flight(pg_url: str) -> None:
    """PostgreSQL: the check reads the run's row FOR SHARE, so a takeover queues behind
    a fenced transaction and a write is either before the takeover or refused."""
    ledger = Ledger(pg_url)
    try:
        new_run(ledger)
        gen = ledger.acquire_lease("f1", "d1", 0.05)
        fenced = ledger.fenced("f1", gen)
        time.sleep(0.1)
        inside, took = threading.Event(), threading.Event()
        order: list[str] = []

        def takeover() -> None:
            inside.wait(10)
            ledger.acquire_lease("f1", "d2", 60)
            order.append("takeover")
            took.set()

        thread = threading.Thread(target=takeover)
        thread.start()

        def slow_write(c: object) -> None:
            inside.set()
            # The takeover is blocked on the run's row meanwhile.
            assert not took.wait(1.0)
            order.append("write")

        fenced._db.write(lambda c: slow_write(c))
        thread.join(10)
        assert order == ["write", "takeover"]
        with pytest.raises(LeaseLost):
            fenced.update_run("f1", state="running")
        row = ledger._db.read(lambda c: c.execute(select(RUN.c.lease_generation)).scalar())
        assert row == gen + 1
    finally:
        ledger.close()
