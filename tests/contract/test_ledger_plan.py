"""The throughput plan in the ledger (migration 0013: subtask.rows, subtask.worker; 0014:
attempt.worker_name), on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from vcdl.errors import LedgerError
from vcdl.ledger import Ledger


def test_a_plan_is_recorded_and_read_back(ledger: Ledger) -> None:
    ledger.create_run("p", "{}", "p/v0", "c0")
    made = ledger.ensure_subtasks("p", 1, 3, rows=[600, 300, 100], workers=["w0", "w1", None])
    assert [(s.shard, s.rows, s.worker) for s in made] == [
        (0, 600, "w0"),
        (1, 300, "w1"),
        (2, 100, None),
    ]
    got = ledger.subtasks("p", 1)
    assert [(s.rows, s.worker) for s in got] == [(600, "w0"), (300, "w1"), (100, None)]


def test_an_even_epoch_records_no_plan(ledger: Ledger) -> None:
    ledger.create_run("p", "{}", "p/v0", "c0")
    made = ledger.ensure_subtasks("p", 0, 2)
    assert [(s.rows, s.worker) for s in made] == [(None, None), (None, None)]


def test_an_existing_epoch_keeps_the_plan_it_was_created_with(ledger: Ledger) -> None:
    """A resumed driver measures other throughputs; the epoch's rows must not move."""
    ledger.create_run("p", "{}", "p/v0", "c0")
    ledger.ensure_subtasks("p", 2, 2, rows=[70, 30], workers=["a", "b"])
    again = ledger.ensure_subtasks("p", 2, 2, rows=[50, 50], workers=["c", "d"])
    assert [(s.rows, s.worker) for s in again] == [(70, "a"), (30, "b")]


@pytest.mark.parametrize("field", ["rows", "workers"])
def test_a_plan_of_the_wrong_length_is_refused(ledger: Ledger, field: str) -> None:
    ledger.create_run("p", "{}", "p/v0", "c0")
    plan = {"rows": [1, 2], "workers": ["a", "b"]}
    plan[field] = plan[field][:1]  # type: ignore[index]
    with pytest.raises(LedgerError, match="one entry per shard"):
        ledger.ensure_subtasks("p", 0, 2, **plan)  # type: ignore[arg-type]
    assert ledger.subtasks("p") == []


def test_an_attempt_records_its_workers_name_beside_its_address(ledger: Ledger) -> None:
    """Migration 0014: the name the throughput plan measures and pins a worker by, on the
    fast path (PostgreSQL's one statement) and the fenced one (a claim under a lease)."""
    ledger.create_run("p", "{}", "p/v0", "c0")
    ledger.ensure_subtasks("p", 0, 3)
    lease = ledger.acquire_lease("p", "driver", 60)
    made = [
        ledger.start_attempt("p", 0, 0, "tcp://h:1", worker_name="spot-3"),
        ledger.start_attempt("p", 0, 1, "tcp://h:2", worker_name="1", lease=lease),
        ledger.start_attempt("p", 0, 2, "tcp://h:3"),
    ]
    assert [(a.worker, a.worker_name) for a in made] == [
        ("tcp://h:1", "spot-3"),
        ("tcp://h:2", "1"),
        ("tcp://h:3", None),
    ]
    got = sorted(ledger.attempts("p"), key=lambda a: a.shard)
    assert [(a.worker, a.worker_name) for a in got] == [
        ("tcp://h:1", "spot-3"),
        ("tcp://h:2", "1"),
        ("tcp://h:3", None),
    ]
