"""The driver's decisions about a subtask (vcdl/ledger/decisions.py), on SQLite and PostgreSQL.

Written by the epoch's executor on the fault path (flows/epoch.py) and told by
``vcdl story``: each decision reads back as written, in time order, filtered
by epoch and shard; a subtask keeps its first ``DECISIONS_PER_SUBTASK``; a
driver whose lease passed on writes none; and the rows survive the ledger's
reopening (what a fresh ``vcdl story`` process sees).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from vcdl.errors import LeaseLost, RunNotFound
from vcdl.ledger import Decision, Ledger
from vcdl.ledger.decisions import DETAIL_CHARS
from vcdl.ledger.models import DECISIONS_PER_SUBTASK


def new_run(ledger: Ledger, name: str = "d1") -> None:
    ledger.create_run(name, json.dumps({"lr": 0.1}), f"{name}/v0", "sum0")
    ledger.ensure_subtasks(name, 0, 4)


T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def steps(rows: list[Decision]) -> list[tuple[int, int, str, str | None, str]]:
    return [(d.epoch, d.shard, d.kind, d.worker, d.detail) for d in rows]


def test_decisions_are_written_and_read_back_in_time_order(ledger: Ledger, db_url: str) -> None:
    new_run(ledger)
    new_run(ledger, "other")
    why = "handed back untrained by tcp://10.0.0.7:4000, under preemption notice"
    # Written out of time order: read back by epoch, shard, then time.
    assert ledger.record_decision("d1", 0, 2, "reissue", why, at=T0 + timedelta(seconds=2))
    assert ledger.record_decision(
        "d1", 0, 2, "handed_back", "untrained, under preemption notice",
        worker="tcp://10.0.0.7:4000", at=T0 + timedelta(seconds=1),
    )  # fmt: skip
    assert ledger.record_decision("d1", 1, 0, "closed", "deferred: late: quorum policy")
    assert ledger.record_decision("d1", 0, 1, "reissue", "timeout after 900s", worker="")
    assert ledger.record_decision("other", 0, 2, "reissue", "not d1's")
    expected = [
        (0, 1, "reissue", None, "timeout after 900s"),  # "" is no worker
        (0, 2, "handed_back", "tcp://10.0.0.7:4000", "untrained, under preemption notice"),
        (0, 2, "reissue", None, why),
        (1, 0, "closed", None, "deferred: late: quorum policy"),
    ]
    assert steps(ledger.decisions("d1")) == expected
    assert steps(ledger.decisions("d1", 0)) == expected[:3]
    assert steps(ledger.decisions("d1", 0, 2)) == expected[1:3]
    assert steps(ledger.decisions("d1", shard=0)) == expected[3:]
    (handed, _) = ledger.decisions("d1", 0, 2)
    assert handed.at == T0 + timedelta(seconds=1) and handed.at.tzinfo is not None
    assert ledger.decisions("d1", 5) == []
    # Another process's ledger (a fresh `vcdl story`) reads the same rows.
    with Ledger(db_url, create=False) as again:
        assert steps(again.decisions("d1")) == expected


def test_a_subtask_keeps_its_first_decisions_only(ledger: Ledger) -> None:
    new_run(ledger)
    for i in range(DECISIONS_PER_SUBTASK):
        assert ledger.record_decision("d1", 0, 0, "reissue", f"try {i}")
    # Past the bound: refused quietly, nothing written; other subtasks unaffected.
    assert not ledger.record_decision("d1", 0, 0, "reissue", "one too many")
    assert ledger.record_decision("d1", 0, 1, "reissue", "its own count")
    kept = ledger.decisions("d1", 0, 0)
    assert len(kept) == DECISIONS_PER_SUBTASK
    assert [d.detail for d in kept][-1] == f"try {DECISIONS_PER_SUBTASK - 1}"
    # A detail quoting a huge exception is cut.
    assert ledger.record_decision("d1", 0, 2, "reissue", "x" * (DETAIL_CHARS * 3))
    (long,) = ledger.decisions("d1", 0, 2)
    assert len(long.detail) == DETAIL_CHARS


def test_an_unknown_run_is_refused(ledger: Ledger) -> None:
    with pytest.raises(RunNotFound):
        ledger.record_decision("nope", 0, 0, "reissue", "x")
    with pytest.raises(RunNotFound):
        ledger.decisions("nope")


def test_a_driver_whose_lease_passed_on_records_nothing(ledger: Ledger) -> None:
    new_run(ledger)
    generation = ledger.acquire_lease("d1", "driver-1", 60)
    mine = ledger.fenced("d1", generation)
    assert mine.record_decision("d1", 0, 0, "reissue", "while I hold it")
    ledger.release_lease("d1", "driver-1")
    ledger.acquire_lease("d1", "driver-2", 60)
    with pytest.raises(LeaseLost):
        mine.record_decision("d1", 0, 0, "reissue", "after it passed on")
    assert [d.detail for d in ledger.decisions("d1")] == ["while I hold it"]
