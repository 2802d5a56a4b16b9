"""Contract suite for :class:`vcdl.ledger.Ledger`, run on SQLite and PostgreSQL.

Every test takes the ``ledger`` fixture and so runs once per backend; the
behaviour the rest of vcdl relies on must not depend on the database. The
``sqlite_url`` and ``pg_url`` fixtures come from tests/pgfixture.py (through
tests/conftest.py).
"""

from __future__ import annotations

import json
import logging
import pickle
import re
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlmodel import Session

from vcdl.errors import (
    AlreadyMerged,
    HeadConflict,
    LeaseHeld,
    LedgerError,
    LedgerNotFound,
    RunNotFound,
)
from vcdl.ledger import Attempt, HeadMoved, Ledger, Version, redact_url
from vcdl.ledger.engine import LedgerEngine
from vcdl.ledger.merging import FoldItem, FoldRefused
from vcdl.ledger.models import FOLDED_CHECKSUM
from vcdl.states import IllegalTransition


def new_run(ledger: Ledger, name: str = "r1", shards: int = 4) -> None:
    ledger.create_run(name, json.dumps({"lr": 0.1}), f"{name}/v0", "sum0")
    ledger.ensure_subtasks(name, 0, shards)


def merge(ledger: Ledger, name: str, attempt_id: str, expected_head: int) -> int:
    # Only a result is merged: an attempt still running records its end first.
    if ledger.get_attempt(attempt_id).state == "running":
        ledger.finish_attempt(attempt_id, state="finished", result_uri=f"{name}/r-{attempt_id}")
    version = ledger.commit_merge(
        name,
        attempt_id,
        expected_head=expected_head,
        uri=f"{name}/v{expected_head + 1}",
        checksum=f"sum{expected_head + 1}",
        alpha=0.5,
        staleness=0,
    )
    return version.number


# -- runs ---------------------------------------------------------------------


def test_create_get_list_runs(ledger: Ledger) -> None:
    run = ledger.create_run("a", '{"x": 1}', "a/v0", "c0")
    assert (run.name, run.state, run.head_version, run.epochs_completed) == ("a", "created", 0, 0)
    assert run.parent_run is None and run.lease_owner is None
    ledger.create_run("b", "{}", "b/v0", "c0")

    got = ledger.get_run("a")
    assert got.config == '{"x": 1}'
    assert ledger.find_run("zzz") is None
    assert [r.name for r in ledger.list_runs()] == ["a", "b"]

    v0 = ledger.head("a")
    assert (v0.number, v0.parent, v0.subtask_id) == (0, None, None)
    assert (v0.uri, v0.checksum) == ("a/v0", "c0")
    assert [v.number for v in ledger.versions("a")] == [0]


def test_timestamps_are_tz_aware_utc(ledger: Ledger) -> None:
    before = datetime.now(UTC)
    run = ledger.create_run("a", "{}", "a/v0", "c0")
    for stamp in (run.created_at, ledger.get_run("a").created_at, ledger.head("a").created_at):
        assert stamp.tzinfo is not None and stamp.utcoffset() == timedelta(0)
        assert before - timedelta(seconds=1) <= stamp <= datetime.now(UTC)


def test_duplicate_run_name_is_refused(ledger: Ledger) -> None:
    ledger.create_run("a", "{}", "a/v0", "c0")
    with pytest.raises(LedgerError, match=r"already exists.*--run NEW.*resume"):
        ledger.create_run("a", "{}", "a/v0-again", "c1")
    assert [v.uri for v in ledger.versions("a")] == ["a/v0"]


def test_create_run_validates_input(ledger: Ledger) -> None:
    with pytest.raises(LedgerError, match="not JSON"):
        ledger.create_run("a", "{not json", "a/v0", "c0")
    with pytest.raises(LedgerError, match="invalid run name"):
        ledger.create_run("", "{}", "a/v0", "c0")
    with pytest.raises(RunNotFound):
        ledger.create_run("child", "{}", "c/v0", "c0", parent_run="nope", parent_version=0)
    assert ledger.list_runs() == []


def test_warm_start_records_parent(ledger: Ledger) -> None:
    ledger.create_run("parent", "{}", "p/v0", "c0")
    child = ledger.create_run("child", "{}", "c/v0", "c0", parent_run="parent", parent_version=0)
    assert (child.parent_run, child.parent_version) == ("parent", 0)
    with pytest.raises(LedgerError, match="no version 7"):
        ledger.create_run("c2", "{}", "c2/v0", "c0", parent_run="parent", parent_version=7)


def test_run_not_found_says_where_and_what_to_do(ledger: Ledger) -> None:
    with pytest.raises(RunNotFound) as info:
        ledger.get_run("ghost")
    message = str(info.value)
    assert "'ghost'" in message and ledger.display_url in message and "vcdl runs" in message
    for call in (
        lambda: ledger.head("ghost"),
        lambda: ledger.versions("ghost"),
        lambda: ledger.subtasks("ghost"),
        lambda: ledger.attempts("ghost"),
        lambda: ledger.evaluations("ghost"),
        lambda: ledger.update_run("ghost", state="running"),
        lambda: ledger.ensure_subtasks("ghost", 0, 2),
        lambda: ledger.acquire_lease("ghost", "me", 10),
    ):
        with pytest.raises(RunNotFound):
            call()
    assert isinstance(info.value, LookupError)  # callers may catch the builtin


def test_update_run(ledger: Ledger) -> None:
    ledger.create_run("a", "{}", "a/v0", "c0")
    created = ledger.get_run("a")
    run = ledger.update_run("a", state="running", epochs_completed=2)
    assert (run.state, run.epochs_completed) == ("running", 2)
    assert run.updated_at >= created.updated_at
    run = ledger.update_run("a", config='{"lr": 1}')
    assert (run.state, run.config) == ("running", '{"lr": 1}')
    with pytest.raises(LedgerError, match="invalid run state"):
        ledger.update_run("a", state="exploded")


# -- subtasks and attempts ----------------------------------------------------


def test_ensure_subtasks_is_idempotent(ledger: Ledger) -> None:
    ledger.create_run("a", "{}", "a/v0", "c0")
    first = ledger.ensure_subtasks("a", 0, 3)
    assert [(s.epoch, s.shard, s.state, s.attempts) for s in first] == [
        (0, 0, "pending", 0),
        (0, 1, "pending", 0),
        (0, 2, "pending", 0),
    ]
    again = ledger.ensure_subtasks("a", 0, 3)
    assert [s.id for s in again] == [s.id for s in first]
    ledger.ensure_subtasks("a", 1, 2)
    assert len(ledger.subtasks("a")) == 5
    assert [s.shard for s in ledger.subtasks("a", 1)] == [0, 1]
    pairs = [(s.epoch, s.shard) for s in ledger.subtasks("a")]
    assert pairs == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    with pytest.raises(LedgerError):
        ledger.ensure_subtasks("a", 0, 0)


def test_attempts_are_numbered_per_subtask(ledger: Ledger) -> None:
    new_run(ledger, "a", shards=2)
    deadline = datetime.now(UTC) + timedelta(minutes=5)
    a1 = ledger.start_attempt("a", 0, 1, "w1", deadline=deadline)
    a2 = ledger.start_attempt("a", 0, 1, "w2")
    b1 = ledger.start_attempt("a", 0, 0, "w1", base_version=0)
    assert (a1.number, a2.number, b1.number) == (1, 2, 1)
    assert len({a1.id, a2.id, b1.id}) == 3 and len(a1.id) == 32
    assert (a1.base_version, a1.state, a1.worker, a1.finished_at) == (0, "running", "w1", None)
    assert a1.deadline is not None and abs(a1.deadline - deadline) < timedelta(milliseconds=1)

    sub = ledger.subtasks("a", 0)[1]
    assert (sub.state, sub.attempts) == ("running", 2)
    assert a1.subtask_id == sub.id
    assert [(a.shard, a.number) for a in ledger.attempts("a", 0)] == [(0, 1), (1, 1), (1, 2)]
    assert ledger.get_attempt(a2.id).worker == "w2"

    with pytest.raises(LedgerError, match="ensure_subtasks"):
        ledger.start_attempt("a", 5, 0, "w1")
    with pytest.raises(LedgerError, match="base version 9"):
        ledger.start_attempt("a", 0, 0, "w1", base_version=9)
    with pytest.raises(LedgerError, match=r"base version -1 .* does not exist"):
        ledger.start_attempt("a", 0, 0, "w1", base_version=-1)
    assert ledger.subtasks("a", 0)[0].attempts == 1  # the refused starts changed nothing


def test_filtered_queries_match_filtering_every_row(ledger: Ledger) -> None:
    # The driver asks these at every barrier and once a second: the filter
    # runs in the database, and must select exactly what filtering the whole
    # run's rows would.
    new_run(ledger, "f", shards=3)
    ledger.ensure_subtasks("f", 1, 3)
    running = ledger.start_attempt("f", 0, 0, "w1")
    done = ledger.start_attempt("f", 0, 1, "w1")
    ledger.finish_attempt(done.id, state="finished", result_uri="f/r1", samples=5)
    killed = ledger.start_attempt("f", 1, 2, "w2")
    ledger.record_checkpoint(killed.id, "f/ckpt", samples=3, train_seconds=0.5)
    ledger.finish_attempt(killed.id, state="killed", reason="worker died")
    merge(ledger, "f", ledger.start_attempt("f", 1, 0, "w2").id, 0)
    sub = ledger.subtasks("f", 0)[2]
    assert sub.id is not None
    ledger.set_subtask_state(sub.id, "dropped", reason="late")

    every = ledger.attempts("f")
    for states in [("running",), ("finished", "interrupted"), ("killed", "merged"), ()]:
        assert ledger.attempts("f", states=states) == [a for a in every if a.state in states]
    assert [a.id for a in ledger.attempts("f", states=("running",))] == [running.id]
    assert ledger.attempts("f", checkpointed=True) == [a for a in every if a.checkpoint_uri]
    assert [a.id for a in ledger.attempts("f", checkpointed=True)] == [killed.id]
    assert ledger.attempts("f", 0, states=("killed",)) == []

    subs = ledger.subtasks("f")
    terminal = {"merged", "dropped", "failed"}
    assert ledger.subtasks("f", exclude_states=terminal) == [
        s for s in subs if s.state not in terminal
    ]
    assert len(ledger.subtasks("f", exclude_states=terminal)) == 4
    assert ledger.subtasks("f", 1, exclude_states=("pending",)) == [
        s for s in subs if s.epoch == 1 and s.state != "pending"
    ]
    for states in [terminal, {"pending"}, {"running"}, set()]:
        assert ledger.count_subtasks("f", states) == sum(s.state in states for s in subs)
    assert ledger.count_subtasks("f", terminal) == 2
    with pytest.raises(RunNotFound):
        ledger.count_subtasks("nope", terminal)
    with pytest.raises(RunNotFound):
        ledger.attempts("nope", states=("running",))
    # A worker's claim reads its own subtask's rows (shard=), not the epoch's.
    for epoch in (0, 1, 7):
        for shard in range(4):
            assert ledger.subtasks("f", epoch, shard=shard) == [
                s for s in subs if (s.epoch, s.shard) == (epoch, shard)
            ]
            assert ledger.attempts("f", epoch, shard=shard) == [
                a for a in every if (a.epoch, a.shard) == (epoch, shard)
            ]
    assert [a.id for a in ledger.attempts("f", 0, shard=1)] == [done.id]
    with pytest.raises(RunNotFound):
        ledger.subtasks("nope", 0, shard=0)


def _merged_in_order(ledger: Ledger, name: str, epochs: list[int]) -> None:
    """A run whose versions v1, v2, ... come from these epochs, in this order."""
    ledger.create_run(name, json.dumps({}), f"{name}/v0", "sum0")
    shard: dict[int, int] = {}
    for head, epoch in enumerate(epochs):
        ledger.ensure_subtasks(name, epoch, len(epochs))
        shard[epoch] = shard.get(epoch, -1) + 1
        merge(ledger, name, ledger.start_attempt(name, epoch, shard[epoch], "w").id, head)


@pytest.mark.parametrize(
    ("epochs", "expected"),
    [
        # The next epoch's merges, already in beside the barrier, are not its.
        ([0, 0, 0, 1, 1], {0: 3, 1: 5, 2: 5}),
        # Nothing merged yet: v0; an epoch without merges ends on the one before.
        ([], {0: 0, 3: 0}),
        ([0, 0, 2], {0: 2, 1: 2, 2: 3}),
        # A quorum-deferred shard of epoch 0 merged after epoch 1's v2: v3
        # (it contains v2), the inexactness flows/epoch.py's docstring names.
        ([0, 1, 0, 1], {0: 3, 1: 4}),
    ],
)
def test_barrier_head(ledger: Ledger, epochs: list[int], expected: dict[int, int]) -> None:
    _merged_in_order(ledger, "b", epochs)
    assert {e: ledger.barrier_head("b", e) for e in expected} == expected
    with pytest.raises(RunNotFound):
        ledger.barrier_head("nope", 0)


def test_returned_rows_are_the_stored_rows(ledger: Ledger) -> None:
    """What a write returns is exactly what a later read gets, every field."""
    new_run(ledger, "a")
    attempt = ledger.start_attempt("a", 0, 0, "w1")
    assert attempt.model_dump() == ledger.get_attempt(attempt.id).model_dump()
    finished = ledger.finish_attempt(attempt.id, state="finished", samples=10, loss=0.25)
    assert finished.model_dump() == ledger.get_attempt(attempt.id).model_dump()
    version = ledger.commit_merge(
        "a", attempt.id, expected_head=0, uri="a/v1", checksum="c1", alpha=0.5, staleness=0
    )
    stored = ledger.get_version("a", 1).model_dump()
    assert version.model_dump() == stored and stored["attempt_id"] == attempt.id
    assert ledger.head("a").model_dump() == stored
    run = ledger.update_run("a", state="running")
    assert run.model_dump() == ledger.get_run("a").model_dump()


def test_rows_work_in_a_fresh_process(db_url: str) -> None:
    # Rows are built without __init__; in a new process nothing else has set
    # up the ORM's attribute machinery yet (a bug seen once: "impl is None").
    code = (
        "import sys; from vcdl.ledger import Ledger\n"
        "with Ledger(sys.argv[1]) as led:\n"
        "    led.create_run('a', '{}', 'a/v0', 'c0'); led.ensure_subtasks('a', 0, 1)\n"
        "    attempt = led.start_attempt('a', 0, 0, 'w')\n"
        "    print(attempt.id == led.get_attempt(attempt.id).id, led.head('a').number)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, db_url], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.split() == ["True", "0"], done.stderr


def test_start_attempt_reads_the_current_head(ledger: Ledger) -> None:
    new_run(ledger, "a", shards=2)
    first = ledger.start_attempt("a", 0, 0, "w1")
    merge(ledger, "a", first.id, 0)
    second = ledger.start_attempt("a", 0, 1, "w1")
    assert second.base_version == 1


def test_finish_attempt(ledger: Ledger) -> None:
    new_run(ledger, "a")
    attempt = ledger.start_attempt("a", 0, 0, "w1")
    done = ledger.finish_attempt(
        attempt.id, state="finished", result_uri="a/r0", samples=100, loss=0.5, train_seconds=1.5
    )
    assert (done.state, done.result_uri, done.samples, done.loss, done.train_seconds) == (
        "finished",
        "a/r0",
        100,
        0.5,
        1.5,
    )
    assert done.finished_at is not None and done.finished_at >= done.started_at
    # Later calls keep what they do not set.
    rejected = ledger.finish_attempt(attempt.id, state="rejected", reason="NaN in fc.weight")
    assert (rejected.state, rejected.result_uri, rejected.reason) == (
        "rejected",
        "a/r0",
        "NaN in fc.weight",
    )
    with pytest.raises(LedgerError, match="invalid attempt state"):
        ledger.finish_attempt(attempt.id, state="exploded")
    with pytest.raises(LedgerError, match="commit_merge"):
        ledger.finish_attempt(attempt.id, state="merged")
    with pytest.raises(LedgerError, match="no attempt"):
        ledger.get_attempt("0" * 32)


def test_finish_attempt_when_it_really_ended(ledger: Ledger) -> None:
    """``ended_at`` (e.g. when the worker died) is kept, clamped to [started_at, now]."""
    new_run(ledger, "a", shards=3)
    a0, a1, a2 = (ledger.start_attempt("a", 0, shard, "w1") for shard in range(3))
    time.sleep(0.05)
    died = a0.started_at + timedelta(milliseconds=20)
    killed = ledger.finish_attempt(a0.id, state="killed", reason="worker died", ended_at=died)
    assert killed.finished_at == died
    assert ledger.get_attempt(a0.id).finished_at == died  # as stored, not only as returned
    # A clock behind the ledger's never gives negative seconds...
    early = ledger.finish_attempt(
        a1.id, state="killed", ended_at=a1.started_at - timedelta(seconds=30)
    )
    assert early.finished_at == a1.started_at
    # ...and a time in the future is no more than now.
    before = datetime.now(UTC)
    late = ledger.finish_attempt(a2.id, state="killed", ended_at=before + timedelta(hours=1))
    assert late.finished_at is not None and before <= late.finished_at <= datetime.now(UTC)


def test_set_subtask_state(ledger: Ledger) -> None:
    new_run(ledger, "a", shards=2)
    sub0, sub1 = ledger.subtasks("a", 0)
    assert sub0.id is not None and sub1.id is not None
    dropped = ledger.set_subtask_state(sub0.id, "dropped", reason="past deadline at quorum")
    assert (dropped.state, dropped.reason) == ("dropped", "past deadline at quorum")
    # An attempt at a dropped subtask is still recorded; the state stays.
    late = ledger.start_attempt("a", 0, 0, "w9")
    assert late.number == 1 and ledger.subtasks("a", 0)[0].state == "dropped"

    with pytest.raises(LedgerError, match="commit_merge"):
        ledger.set_subtask_state(sub1.id, "merged")
    with pytest.raises(LedgerError, match="invalid subtask state"):
        ledger.set_subtask_state(sub1.id, "lost")
    attempt = ledger.start_attempt("a", 0, 1, "w1")
    merge(ledger, "a", attempt.id, 0)
    with pytest.raises(LedgerError, match="final"):
        ledger.set_subtask_state(sub1.id, "failed")


# -- the merge ----------------------------------------------------------------


def test_commit_merge_moves_the_head(ledger: Ledger) -> None:
    new_run(ledger, "a")
    attempt = ledger.start_attempt("a", 0, 2, "w1")
    ledger.finish_attempt(attempt.id, state="finished", result_uri="a/r")
    version = ledger.commit_merge(
        "a", attempt.id, expected_head=0, uri="a/v1", checksum="c1", alpha=0.25, staleness=0
    )
    assert (version.number, version.parent, version.attempt_id, version.epoch) == (
        1,
        0,
        attempt.id,
        0,
    )
    assert (version.alpha, version.staleness, version.uri, version.checksum) == (
        0.25,
        0,
        "a/v1",
        "c1",
    )
    assert ledger.get_run("a").head_version == 1
    assert ledger.head("a").id == version.id
    assert ledger.get_version("a", 1).uri == "a/v1"
    merged = ledger.get_attempt(attempt.id)
    assert merged.state == "merged" and merged.result_uri == "a/r"
    sub = ledger.subtasks("a", 0)[2]
    assert (sub.state, sub.merged_version, version.subtask_id) == ("merged", 1, sub.id)


def _finished(ledger: Ledger, name: str, shard: int) -> str:
    attempt = ledger.start_attempt(name, 0, shard, f"w{shard}")
    ledger.finish_attempt(attempt.id, state="finished", result_uri=f"{name}/r{shard}")
    return attempt.id


def test_commit_fold_records_k_versions_and_moves_the_head_to_the_last(ledger: Ledger) -> None:
    new_run(ledger, "a")
    ids = [_finished(ledger, "a", shard) for shard in (2, 0, 3)]
    items = [
        FoldItem(aid, alpha=0.5 + i / 10, staleness=i, uri=f"a/v{i + 1}")
        for i, aid in enumerate(ids)
    ]
    made = ledger.commit_fold("a", items, expected_head=0, checksum="c3")
    assert [(v.number, v.parent, v.attempt_id) for v in made] == [
        (1, 0, ids[0]),
        (2, 1, ids[1]),
        (3, 2, ids[2]),
    ]
    assert ledger.get_run("a").head_version == 3
    stored = {v.number: v for v in ledger.versions("a")}
    # Only the last one's weights were written: the others are pruned from birth.
    for n in (1, 2):
        assert stored[n].checksum == FOLDED_CHECKSUM and stored[n].pruned_at is not None
    assert (stored[3].checksum, stored[3].pruned_at, stored[3].uri) == ("c3", None, "a/v3")
    assert [(v.alpha, v.staleness) for v in made] == [(0.5, 0), (0.6, 1), (0.7, 2)]
    assert [stored[n].alpha for n in (1, 2, 3)] == [0.5, 0.6, 0.7]
    for shard, number in zip((2, 0, 3), (1, 2, 3), strict=True):
        sub = ledger.subtasks("a", 0)[shard]
        assert (sub.state, sub.merged_version) == ("merged", number)
    assert {ledger.get_attempt(a).state for a in ids} == {"merged"}


def test_a_refused_fold_changes_nothing(ledger: Ledger) -> None:
    new_run(ledger, "a")
    ids = [_finished(ledger, "a", shard) for shard in (0, 1, 2)]
    # Shard 1 merged meanwhile by another attempt: the fold's second merge cannot go.
    rival = _finished(ledger, "a", 1)
    merge(ledger, "a", rival, 0)
    items = [FoldItem(a, 0.5, 0, f"a/f{i}") for i, a in enumerate(ids)]
    with pytest.raises(FoldRefused, match="one at a time"):
        ledger.commit_fold("a", items, expected_head=1, checksum="c")
    assert ledger.get_run("a").head_version == 1
    assert [v.number for v in ledger.versions("a")] == [0, 1]
    # Not even the duplicate mark: the caller's one-at-a-time merges record it.
    assert [ledger.get_attempt(a).state for a in ids] == ["finished"] * 3
    assert [s.state for s in ledger.subtasks("a", 0)][:3] == ["running", "merged", "running"]
    # A head that moved on refuses the fold too.
    with pytest.raises(FoldRefused):
        ledger.commit_fold("a", [items[0], items[2]], expected_head=0, checksum="c")
    assert ledger.get_run("a").head_version == 1
    made = ledger.commit_fold("a", [items[0], items[2]], expected_head=1, checksum="c")
    assert [v.number for v in made] == [2, 3]


def test_stale_expected_head_is_a_head_conflict(ledger: Ledger) -> None:
    new_run(ledger, "a")
    first = ledger.start_attempt("a", 0, 0, "w1")
    second = ledger.start_attempt("a", 0, 1, "w2")
    merge(ledger, "a", first.id, 0)
    with pytest.raises(HeadConflict, match="v1, not v0"):
        merge(ledger, "a", second.id, 0)
    # Nothing changed: the caller re-reads the head and retries.
    assert ledger.get_run("a").head_version == 1
    assert ledger.get_attempt(second.id).state == "finished"  # as before the refused merge
    assert ledger.subtasks("a", 0)[1].merged_version is None
    assert merge(ledger, "a", second.id, 1) == 2
    with pytest.raises(HeadConflict):
        merge(ledger, "a", ledger.start_attempt("a", 0, 2, "w3").id, 7)


def test_head_conflict_carries_the_head(ledger: Ledger) -> None:
    new_run(ledger, "a")
    merge(ledger, "a", ledger.start_attempt("a", 0, 0, "w1").id, 0)
    merge(ledger, "a", ledger.start_attempt("a", 0, 1, "w1").id, 1)
    late = ledger.start_attempt("a", 0, 2, "w2", base_version=0)
    with pytest.raises(HeadMoved) as info:
        merge(ledger, "a", late.id, 0)
    moved = info.value
    assert isinstance(moved, HeadConflict)  # callers catching HeadConflict still do
    assert moved.head.model_dump() == ledger.head("a").model_dump()  # every field, tz-aware
    assert moved.head.number == 2 and moved.head.created_at.tzinfo is not None
    assert moved.head.uri == "a/v2" and moved.head.parent == 1
    # It survives pickling (Dask and Prefect ship exceptions between processes).
    again = pickle.loads(pickle.dumps(moved))
    assert type(again) is HeadMoved and str(again) == str(moved)
    assert again.head.number == 2 and again.head.checksum == "sum2"
    # Retrying onto the head it carried succeeds.
    assert merge(ledger, "a", late.id, moved.head.number) == 3


def test_second_merge_of_a_subtask_is_already_merged(ledger: Ledger) -> None:
    new_run(ledger, "a")
    winner = ledger.start_attempt("a", 0, 3, "w1")
    loser = ledger.start_attempt("a", 0, 3, "w2")
    merge(ledger, "a", winner.id, 0)
    with pytest.raises(AlreadyMerged, match="v1"):
        merge(ledger, "a", loser.id, 1)
    duplicate = ledger.get_attempt(loser.id)
    assert duplicate.state == "duplicate" and duplicate.finished_at is not None
    assert ledger.get_run("a").head_version == 1
    assert len(ledger.versions("a")) == 2
    # The winner cannot be merged twice either, and stays merged.
    with pytest.raises(AlreadyMerged):
        merge(ledger, "a", winner.id, 1)
    assert ledger.get_attempt(winner.id).state == "merged"
    # Attempts started after the merge are recorded; the subtask stays merged.
    late = ledger.start_attempt("a", 0, 3, "w3")
    assert late.number == 3
    sub = ledger.subtasks("a", 0)[3]
    assert (sub.state, sub.attempts, sub.merged_version) == ("merged", 3, 1)


def test_a_merge_repeated_after_its_answer_was_lost_is_the_same_merge(ledger: Ledger) -> None:
    """PostgreSQL's fast path repeats a commit whose connection died on the way back
    (vcdl/ledger/retry.py): finding its own merge committed, it returns it."""
    new_run(ledger, "a")
    attempt = ledger.start_attempt("a", 0, 0, "w1")
    ledger.finish_attempt(attempt.id, state="finished", result_uri="a/r")
    same = {"expected_head": 0, "uri": "a/v1-x", "checksum": "s1", "alpha": 0.5, "staleness": 0}
    first = ledger.commit_merge("a", attempt.id, **same)  # type: ignore[arg-type]
    again = ledger.commit_merge("a", attempt.id, **same)  # type: ignore[arg-type]
    assert again == first and again.number == 1
    assert ledger.get_attempt(attempt.id).state == "merged"
    assert len(ledger.versions("a")) == 2
    # Another merge of it (another group) is still refused.
    with pytest.raises(AlreadyMerged):
        ledger.commit_merge("a", attempt.id, **(same | {"uri": "a/v1-y"}))  # type: ignore[arg-type]


def test_unique_constraint_is_the_backstop(ledger: Ledger) -> None:
    """A version for the subtask that bypassed the checks (a racing merger) wins."""
    new_run(ledger, "a")
    sub = ledger.subtasks("a", 0)[0]
    attempt = ledger.start_attempt("a", 0, 0, "w1")
    with Session(ledger._engine) as s, s.begin():
        s.add(Version(run="a", number=50, parent=None, subtask_id=sub.id, uri="x", checksum="x"))
    with pytest.raises(AlreadyMerged, match="v50"):
        merge(ledger, "a", attempt.id, 0)
    assert ledger.get_attempt(attempt.id).state == "duplicate"
    assert ledger.get_run("a").head_version == 0  # the CAS was rolled back with the insert

    # Any other constraint violation is an inconsistency, not a duplicate.
    other = ledger.start_attempt("a", 0, 1, "w1")
    with Session(ledger._engine) as s, s.begin():
        s.add(Version(run="a", number=1, parent=0, uri="y", checksum="y"))
    with pytest.raises(LedgerError, match="other than at-most-once") as info:
        merge(ledger, "a", other.id, 0)
    assert not isinstance(info.value, AlreadyMerged)
    assert ledger.get_attempt(other.id).state == "finished"  # as before the refused merge


def test_commit_merge_checks_the_attempt(ledger: Ledger) -> None:
    new_run(ledger, "a")
    new_run(ledger, "b")
    attempt = ledger.start_attempt("a", 0, 0, "w1")
    with pytest.raises(LedgerError, match="belongs to run 'a'"):
        merge(ledger, "b", attempt.id, 0)
    with pytest.raises(LedgerError, match="no attempt"):
        merge(ledger, "a", "f" * 32, 0)


def test_versions_form_a_chain(ledger: Ledger) -> None:
    new_run(ledger, "a", shards=3)
    ledger.ensure_subtasks("a", 1, 3)
    for epoch in (0, 1):
        for shard in (2, 0, 1):
            attempt = ledger.start_attempt("a", epoch, shard, "w")
            merge(ledger, "a", attempt.id, ledger.head("a").number)
    versions = ledger.versions("a")
    assert [v.number for v in versions] == list(range(7))
    assert [v.parent for v in versions] == [None, 0, 1, 2, 3, 4, 5]
    assert [v.epoch for v in versions] == [None, 0, 0, 0, 1, 1, 1]
    assert len({v.subtask_id for v in versions[1:]}) == 6
    assert ledger.head("a").number == 6
    assert all(s.state == "merged" for s in ledger.subtasks("a"))
    with pytest.raises(LedgerError, match="no version 9"):
        ledger.get_version("a", 9)


# -- evaluations and leases ---------------------------------------------------


def test_evaluations(ledger: Ledger) -> None:
    new_run(ledger, "a")
    merge(ledger, "a", ledger.start_attempt("a", 0, 0, "w").id, 0)
    assert ledger.evaluations("a") == []
    first = ledger.record_evaluation("a", 0, None, "test", 0.1, 2.3, 1000)
    ledger.record_evaluation("a", 1, 0, "test", 0.5, 1.2, 1000)
    ledger.record_evaluation("a", 1, 0, "train", 0.6, 1.1, 5000)
    assert first.created_at.tzinfo is not None
    rows = ledger.evaluations("a")
    assert [(e.version, e.epoch, e.split, e.accuracy, e.loss, e.samples) for e in rows] == [
        (0, None, "test", 0.1, 2.3, 1000),
        (1, 0, "test", 0.5, 1.2, 1000),
        (1, 0, "train", 0.6, 1.1, 5000),
    ]
    with pytest.raises(LedgerError, match="no version 5"):
        ledger.record_evaluation("a", 5, 0, "test", 0.5, 1.2, 1000)


def test_lease_acquire_renew_held_expire_release(ledger: Ledger) -> None:
    ledger.create_run("a", "{}", "a/v0", "c0")
    ledger.acquire_lease("a", "driver-1", 60)
    first = ledger.get_run("a").lease_expires
    ledger.acquire_lease("a", "driver-1", 120)  # renew
    run = ledger.get_run("a")
    assert run.lease_owner == "driver-1"
    assert first is not None and run.lease_expires is not None and run.lease_expires > first

    with pytest.raises(LeaseHeld, match="driven by driver-1 until") as info:
        ledger.acquire_lease("a", "driver-2", 60)
    assert "wait" in str(info.value)

    ledger.release_lease("a", "driver-2")  # not its lease: no-op
    assert ledger.get_run("a").lease_owner == "driver-1"
    ledger.release_lease("a", "driver-1")
    run = ledger.get_run("a")
    assert (run.lease_owner, run.lease_expires) == (None, None)
    ledger.acquire_lease("a", "driver-2", 60)
    assert ledger.get_run("a").lease_owner == "driver-2"
    ledger.release_lease("a", "driver-2")

    # An expired lease is free for anyone.
    ledger.acquire_lease("a", "driver-3", 0.05)
    time.sleep(0.1)
    ledger.acquire_lease("a", "driver-4", 60)
    assert ledger.get_run("a").lease_owner == "driver-4"
    with pytest.raises(LedgerError, match="ttl"):
        ledger.acquire_lease("a", "driver-4", 0)
    with pytest.raises(RunNotFound):
        ledger.release_lease("ghost", "driver-4")


# -- opening, URLs, passwords -------------------------------------------------


def test_reopen_sees_the_same_ledger(ledger: Ledger) -> None:
    new_run(ledger, "a")
    merge(ledger, "a", ledger.start_attempt("a", 0, 0, "w").id, 0)
    with Ledger(ledger.url) as again:
        assert again.head("a").number == 1
        assert len(again.subtasks("a")) == 4


def test_a_reader_never_creates_a_ledger(db_url: str) -> None:
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        path = Path(str(url.database))
        with pytest.raises(LedgerNotFound, match=re.escape(f"no ledger file {path}")):
            Ledger(db_url, create=False)
        assert not path.parent.exists()  # not even its directory
        path.parent.mkdir()
        sqlite3.connect(path).close()  # an empty database file
    # An empty database (an empty SQLite file, a fresh PostgreSQL schema): a
    # read-only open says so and leaves it empty.
    with pytest.raises(LedgerNotFound, match=r"no vcdl tables.*--home"):
        Ledger(db_url, create=False)
    with Ledger(db_url) as made:  # a writer creates it ...
        assert made.list_runs() == []
        made.create_run("a", "{}", "a/v0", "c0")
    with Ledger(db_url, create=False) as reader:  # ... and then readers open it
        assert [r.name for r in reader.list_runs()] == ["a"]


def test_password_never_shown(db_url: str) -> None:
    url = make_url(db_url)
    if url.get_backend_name() == "postgresql":
        # Trust auth ignores the password, so the ledger really opens with it.
        secret_url = url.set(password="s3cr3t-pw").render_as_string(hide_password=False)
        with Ledger(secret_url) as led:
            assert led.url == secret_url  # for child processes; never displayed
            for shown in (led.display_url, repr(led), str(led)):
                assert "s3cr3t-pw" not in shown and "***" in shown
            with pytest.raises(RunNotFound) as info:
                led.get_run("ghost")
            assert "s3cr3t-pw" not in str(info.value)
    assert redact_url("postgresql+psycopg://u:s3cr3t-pw@db:5432/x") == (
        "postgresql+psycopg://u:***@db:5432/x"
    )
    assert "s3cr3t-pw" not in redact_url("postgresql://u:s3cr3t-pw@db:5432/x?sslmode=require")
    assert "s3cr3t-pw" not in redact_url("not a url s3cr3t-pw")


def test_bad_urls_are_ledger_errors_without_the_password() -> None:
    # Port 1 refuses at once; the message must still not leak the password.
    with pytest.raises(LedgerError) as info:
        Ledger("postgresql+psycopg://u:s3cr3t-pw@127.0.0.1:1/x?connect_timeout=2")
    assert "s3cr3t-pw" not in str(info.value) and "u:***@127.0.0.1:1" in str(info.value)
    with pytest.raises(LedgerError, match="unsupported"):
        Ledger("mysql://u:s3cr3t-pw@h/db")
    with pytest.raises(LedgerError, match="cannot parse") as info:
        Ledger("::s3cr3t-pw::")
    assert "s3cr3t-pw" not in str(info.value)


def test_sqlite_ledger_settings(sqlite_url: str) -> None:
    with Ledger(sqlite_url) as led:
        led.create_run("a", "{}", "a/v0", "c0")
        assert led.backend == "sqlite"
        path = make_url(sqlite_url).database
        assert path is not None
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        # foreign_keys is per connection: check one of the ledger's own.
        with led._engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000


# -- pools and schema ---------------------------------------------------------


def _with_query(url: str, **params: str) -> str:
    return make_url(url).update_query_dict(params).render_as_string(hide_password=False)


def test_pool_settings_from_url_then_environment(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VCDL_LEDGER_POOL_SIZE", "4")
    monkeypatch.setenv("VCDL_LEDGER_POOL_RECYCLE", "77")
    url = _with_query(db_url, pool_size="3", max_overflow="1", pool_timeout="5")
    with Ledger(url) as led:
        pool = led._engine.pool
        # The URL wins over the environment, the environment over the defaults.
        assert (pool.size(), pool._max_overflow, pool._timeout) == (3, 1, 5)  # type: ignore[attr-defined]
        assert pool._recycle == 77
        led.create_run("a", "{}", "a/v0", "c0")  # the options were not passed to the driver
        assert led.url == url  # child processes get the same settings
    monkeypatch.delenv("VCDL_LEDGER_POOL_SIZE")
    monkeypatch.delenv("VCDL_LEDGER_POOL_RECYCLE")
    with Ledger(db_url) as led:
        pool = led._engine.pool
        assert (pool.size(), pool._max_overflow, pool._recycle) == (2, 8, 1800)  # type: ignore[attr-defined]


def test_bad_pool_settings_are_refused_without_the_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "postgresql+psycopg://u:s3cr3t-pw@127.0.0.1:1/x"
    with pytest.raises(LedgerError, match="pool_size must be a number >= 0") as info:
        Ledger(url + "?pool_size=many")
    assert "s3cr3t-pw" not in str(info.value) and "u:***@" in str(info.value)
    monkeypatch.setenv("VCDL_LEDGER_MAX_OVERFLOW", "-1")
    with pytest.raises(LedgerError, match=r"\$VCDL_LEDGER_MAX_OVERFLOW must be"):
        Ledger(url)


@pytest.mark.postgres
def test_postgres_connection_defaults(pg_url: str) -> None:
    url = make_url(pg_url)
    with Ledger(pg_url) as led, led._engine.connect() as conn:
        # The URL's own application_name (the fixture's) is kept ...
        assert (
            conn.exec_driver_sql("SHOW application_name").scalar() == url.query["application_name"]
        )
    bare = url.difference_update_query(["application_name"]).render_as_string(hide_password=False)
    with Ledger(bare) as led, led._engine.connect() as conn:
        # ... else the ledger's connections say who they are.
        assert conn.exec_driver_sql("SHOW application_name").scalar() == "vcdl"


@pytest.mark.postgres
def test_connections_idle_past_ping_idle_are_pinged_and_replaced(pg_url: str) -> None:
    """A server that hung up on pooled connections costs a reconnect, not an error."""
    from tests.pgfixture import _connect_admin

    app = make_url(pg_url).query["application_name"]
    admin, _user = _connect_admin()

    def hang_up() -> None:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = %s AND pid <> pg_backend_pid()",
            (app,),
        )

    with admin:
        with Ledger(_with_query(pg_url, pool_ping_idle="0.2")) as led:
            led.create_run("a", "{}", "a/v0", "c0")
            hang_up()
            time.sleep(0.3)  # idle past pool_ping_idle: pinged, found dead, replaced
            assert led.get_run("a").name == "a"
            assert not led._engine.pool._pre_ping
        with Ledger(_with_query(pg_url, pool_ping_idle="60")) as led:
            led.get_run("a")
            hang_up()
            # Used again within pool_ping_idle: not pinged (that is the point:
            # no round trip per call), so this read meets the dead connection;
            # its error invalidates the pool and the read runs again on a new
            # one (vcdl/ledger/retry.py), a blip not even logged.
            assert led.get_run("a").name == "a"
    with Ledger(_with_query(pg_url, pool_ping_idle="0")) as led:
        assert led._engine.pool._pre_ping  # SQLAlchemy's own: every checkout


def test_password_never_logged(db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    url = make_url(db_url)
    if url.get_backend_name() == "postgresql":
        db_url = url.set(password="s3cr3t-pw").render_as_string(hide_password=False)
    caplog.set_level(logging.DEBUG)
    with Ledger(db_url) as led:  # a fresh ledger: the migrations log too
        new_run(led, "a")
        attempt = led.start_attempt("a", 0, 0, "w")
        merge(led, "a", attempt.id, 0)
        with pytest.raises(HeadConflict):
            merge(led, "a", led.start_attempt("a", 0, 1, "w").id, 0)
    with pytest.raises(LedgerError):
        Ledger("postgresql+psycopg://u:s3cr3t-pw@127.0.0.1:1/x?connect_timeout=2")
    assert caplog.records and "s3cr3t-pw" not in caplog.text


def test_driver_errors_are_scrubbed_of_the_password() -> None:
    # Should a driver ever echo the password, the LedgerError still hides it.
    db = LedgerEngine("postgresql+psycopg://u:s3cr3t-pw@db:5432/x")
    orig = Exception("auth failed for u with password s3cr3t-pw")
    error = db.error(OperationalError("SELECT 1", {}, orig))
    assert "s3cr3t-pw" not in str(error) and "password ***" in str(error)
    db.dispose()


def test_open_creates_the_schema_at_head(ledger: Ledger) -> None:
    from vcdl.ledger.migrations import head_revision

    with ledger._engine.connect() as conn:
        versions = conn.execute(text("SELECT version_num FROM alembic_version")).all()
    assert versions == [(head_revision(),)]


def test_attempt_timings_are_recorded_and_summed(ledger: Ledger) -> None:
    """The per-phase breakdown: set when the attempt ends, phases added later are summed."""
    from vcdl.ledger import attempt_timings

    new_run(ledger, "a")
    attempt = ledger.start_attempt("a", 0, 0, "w1")
    assert attempt_timings(attempt) == {}
    ledger.finish_attempt(attempt.id, state="finished", timings={"train": 4.5, "read": 0.25})
    ledger.add_timings(attempt.id, {"read": 0.5, "prefect": 0.125})
    ledger.add_timings(attempt.id, {})
    got = attempt_timings(ledger.get_attempt(attempt.id))
    assert got == {"train": 4.5, "read": 0.75, "prefect": 0.125}
    with pytest.raises(LedgerError, match="no attempt"):
        ledger.add_timings("nope", {"x": 1.0})


def test_merge_path_errors_say_what_is_wrong(ledger: Ledger) -> None:
    """The merge path's calls explain a missing run, subtask, attempt or final state.

    (On PostgreSQL these calls run on psycopg directly, vcdl.ledger.pg: the
    explanations come from a second read there, from the same transaction on
    SQLite; the messages must not differ.)
    """
    new_run(ledger, "a", shards=1)
    with pytest.raises(RunNotFound):
        ledger.head("nope")
    with pytest.raises(RunNotFound):
        ledger.start_attempt("nope", 0, 0, "w")
    with pytest.raises(LedgerError, match="no subtask epoch 0 shard 5"):
        ledger.start_attempt("a", 0, 5, "w")
    with pytest.raises(LedgerError, match=r"base version 3 .* does not exist \(head is v0\)"):
        ledger.start_attempt("a", 0, 0, "w", base_version=3)
    with pytest.raises(LedgerError, match="no attempt"):
        ledger.finish_attempt("0" * 32, state="finished")
    attempt = ledger.start_attempt("a", 0, 0, "w", deadline=datetime(2030, 1, 1, tzinfo=UTC))
    assert ledger.get_attempt(attempt.id).deadline == datetime(2030, 1, 1, tzinfo=UTC)
    # Nothing was counted by the refused starts.
    assert [s.attempts for s in ledger.subtasks("a")] == [1]
    merge(ledger, "a", attempt.id, 0)
    with pytest.raises(LedgerError, match="is merged; its state is final"):
        ledger.finish_attempt(attempt.id, state="failed", reason="late")
    assert ledger.get_attempt(attempt.id).state == "merged"
    head = ledger.head("a")
    assert (head.number, head.created_at.tzinfo) == (1, UTC)


@pytest.mark.postgres
def test_merge_path_survives_a_server_hang_up(pg_url: str) -> None:
    """The psycopg fast path treats a dead connection as SQLAlchemy does.

    A read that meets it runs again on a new connection; a write that meets it
    may have been applied, so it fails with a LedgerError (never repeated
    blindly); either way the pool is invalidated and the next call
    reconnects; pooled connections are left as SQLAlchemy expects them (not
    in autocommit).
    """
    from tests.pgfixture import _connect_admin

    app = make_url(pg_url).query["application_name"]
    admin, _user = _connect_admin()
    with admin, Ledger(_with_query(pg_url, pool_ping_idle="60")) as led:
        new_run(led, "a")
        attempt = led.start_attempt("a", 0, 0, "w")
        assert led.head("a").number == 0

        def hang_up() -> None:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s AND pid <> pg_backend_pid()",
                (app,),
            )

        hang_up()
        assert led.head("a").number == 0
        hang_up()
        with pytest.raises(LedgerError, match="ledger postgresql"):
            led.finish_attempt(attempt.id, state="finished")
        assert led.get_attempt(attempt.id).state == "running"  # the server never had it
        assert led.finish_attempt(attempt.id, state="finished").state == "finished"
        assert merge(led, "a", attempt.id, 0) == 1
        with led._engine.connect() as conn:
            assert not conn.connection.driver_connection.autocommit  # type: ignore[union-attr]
            # A SQLAlchemy transaction on a connection the fast path used: still one.
            with conn.begin():
                conn.execute(text("UPDATE run SET state = 'running' WHERE name = 'a'"))
                assert conn.in_transaction()
        assert led.get_run("a").state == "running"


# -- the lifecycle (vcdl.states) ---------------------------------------------------


def test_illegal_moves_are_refused_naming_both_states(ledger: Ledger) -> None:
    new_run(ledger, "a", shards=4)
    sub0, sub1, sub2, _ = ledger.subtasks("a", 0)
    assert sub0.id is not None and sub1.id is not None and sub2.id is not None
    ledger.set_subtask_state(sub0.id, "failed", reason="budget spent")
    with pytest.raises(IllegalTransition, match="'failed' to 'dropped'"):
        ledger.set_subtask_state(sub0.id, "dropped")
    deferred = ledger.set_subtask_state(sub1.id, "deferred", reason="late: quorum policy")
    assert deferred.state == "deferred"
    # Claimed again in a later epoch: running, then merged as usual.
    again = ledger.start_attempt("a", 0, 1, "w1")
    assert ledger.subtasks("a", 0)[1].state == "running"
    merge(ledger, "a", again.id, 0)

    attempt = ledger.start_attempt("a", 0, 2, "w1")
    with pytest.raises(IllegalTransition, match="'running' to 'rejected'"):
        ledger.finish_attempt(attempt.id, state="rejected", reason="NaN")  # no result yet
    ledger.finish_attempt(attempt.id, state="finished", result_uri="a/r2")
    ledger.finish_attempt(attempt.id, state="rejected", reason="NaN")
    with pytest.raises(IllegalTransition, match="'rejected' to 'finished'"):
        ledger.finish_attempt(attempt.id, state="finished")
    assert ledger.get_attempt(attempt.id).state == "rejected"

    with pytest.raises(IllegalTransition, match="'created' to 'completed'"):
        ledger.update_run("a", state="completed")
    assert ledger.get_run("a").state == "created"


def test_only_a_result_is_merged_and_only_into_an_open_subtask(ledger: Ledger) -> None:
    new_run(ledger, "a", shards=2)
    running = ledger.start_attempt("a", 0, 0, "w1")
    with pytest.raises(IllegalTransition, match="'running' to 'merged'"):
        ledger.commit_merge(
            "a", running.id, expected_head=0, uri="a/v1", checksum="c", alpha=0.5, staleness=0
        )
    failed_sub = ledger.subtasks("a", 0)[1]
    assert failed_sub.id is not None
    late = ledger.start_attempt("a", 0, 1, "w2")
    ledger.finish_attempt(late.id, state="finished", result_uri="a/r")
    ledger.set_subtask_state(failed_sub.id, "failed", reason="budget spent")
    with pytest.raises(IllegalTransition, match="'failed' to 'merged'"):
        ledger.commit_merge(
            "a", late.id, expected_head=0, uri="a/v1", checksum="c", alpha=0.5, staleness=0
        )
    assert ledger.get_run("a").head_version == 0  # nothing moved


def test_abandoning_an_attempt_that_already_ended_changes_nothing(ledger: Ledger) -> None:
    new_run(ledger, "a", shards=2)
    alive = ledger.start_attempt("a", 0, 0, "w1")
    gone = ledger.abandon_attempt(alive.id, state="killed", reason="worker died")
    assert gone is not None and (gone.state, gone.reason) == ("killed", "worker died")
    done = ledger.start_attempt("a", 0, 1, "w2")
    ledger.finish_attempt(done.id, state="finished", result_uri="a/r1")
    # The driver's view was a moment old: the attempt recorded its result meanwhile.
    assert ledger.abandon_attempt(done.id, state="timeout", reason="past its deadline") is None
    assert ledger.get_attempt(done.id).state == "finished"
    # A killed attempt that was alive after all still records its end.
    assert ledger.finish_attempt(alive.id, state="finished").state == "finished"
    with pytest.raises(LedgerError, match="killed or timeout"):
        ledger.abandon_attempt(done.id, state="failed", reason="x")


# -- a result that comes in after its subtask was merged ---------------------------


@pytest.mark.parametrize("fenced", [False, True], ids=["fast path", "fenced"])
def test_a_result_after_its_subtask_merged_is_recorded_a_duplicate_by_its_finish(
    ledger: Ledger, fenced: bool
) -> None:
    """Past the run's last settle nobody records a late result: its own finish does.

    The run is completed when the late results come in. Both SQL paths: the
    PostgreSQL fast path, and SQLAlchemy's statement (a fenced ledger on
    PostgreSQL, every SQLite ledger).
    """
    new_run(ledger, "a", shards=3)
    ledger.update_run("a", state="running")
    late = ledger.start_attempt("a", 0, 0, "w-late")
    cut = ledger.start_attempt("a", 0, 1, "w-cut")
    ledger.abandon_attempt(cut.id, state="killed", reason="worker died")
    merge(ledger, "a", ledger.start_attempt("a", 0, 0, "w1").id, 0)
    merge(ledger, "a", ledger.start_attempt("a", 0, 1, "w1").id, 1)
    open_result = ledger.start_attempt("a", 0, 2, "w2")
    ledger.update_run("a", state="completed", epochs_completed=1)
    view = ledger.fenced("a", ledger.acquire_lease("a", "driver", 60)) if fenced else ledger

    done = view.finish_attempt(
        late.id, state="finished", result_uri="a/r-late", samples=50, loss=0.5
    )
    assert (done.state, done.reason) == (
        "duplicate",
        "subtask already merged as v1 by another attempt; this result came in after it",
    )
    # What the worker recorded is kept: its result, its numbers, its end.
    assert (done.result_uri, done.samples, done.loss) == ("a/r-late", 50, 0.5)
    assert done.finished_at is not None
    assert ledger.get_attempt(late.id).model_dump() == done.model_dump()  # as stored
    # A partial result of an attempt given up on, alive after all: the same.
    partial = view.finish_attempt(
        cut.id, state="interrupted", result_uri="a/r-cut", reason="preemption notice"
    )
    assert partial.state == "duplicate" and (partial.reason or "").startswith(
        "subtask already merged as v2 by another"
    )
    # A duplicate is final; the run, its head and the subtasks are as they were.
    with pytest.raises(IllegalTransition, match="'duplicate' to 'finished'"):
        view.finish_attempt(late.id, state="finished")
    run = ledger.get_run("a")
    assert (run.state, run.head_version) == ("completed", 2)
    subs = ledger.subtasks("a", 0)
    assert [(s.state, s.merged_version) for s in subs] == [
        ("merged", 1),
        ("merged", 2),
        ("running", None),
    ]
    # A subtask nobody merged: its result is finished, mergeable by a resume.
    kept = view.finish_attempt(open_result.id, state="finished", result_uri="a/r2", reason="ok")
    assert (kept.state, kept.reason) == ("finished", "ok")
    # Only a result is a duplicate: an attempt that failed or was given up on is that.
    failed = ledger.start_attempt("a", 0, 0, "w3")
    assert view.finish_attempt(failed.id, state="failed", reason="boom").state == "failed"
    gone = ledger.start_attempt("a", 0, 0, "w4")
    assert view.abandon_attempt(gone.id, state="timeout", reason="late") is not None
    assert ledger.get_attempt(gone.id).state == "timeout"
    # A merge of an attempt still running makes no duplicate of it: its finish will.
    running = ledger.start_attempt("a", 0, 1, "w5")
    with pytest.raises(AlreadyMerged):
        ledger.commit_merge(
            "a", running.id, expected_head=2, uri="a/v3", checksum="c", alpha=0.5, staleness=0
        )
    assert ledger.get_attempt(running.id).state == "running"
    assert view.finish_attempt(running.id, state="finished").state == "duplicate"


@pytest.mark.parametrize("fenced", [False, True], ids=["fast path", "fenced"])
def test_a_result_after_its_subtask_closed_unmerged_is_recorded_rejected_by_its_finish(
    ledger: Ledger, fenced: bool
) -> None:
    """A result that comes in after its subtask was dropped (quorum) or failed, past
    the run's last settle: its own finish records it rejected, not finished (which
    an audit would read as a result still waiting for a merge that never comes)."""
    new_run(ledger, "a", shards=3)
    ledger.update_run("a", state="running")
    dropped = ledger.start_attempt("a", 0, 0, "w-dropped")
    failed = ledger.start_attempt("a", 0, 1, "w-failed")
    ledger.abandon_attempt(failed.id, state="killed", reason="worker died")
    open_result = ledger.start_attempt("a", 0, 2, "w-open")
    subs = ledger.subtasks("a", 0)
    ledger.set_subtask_state(subs[0].id, "dropped", reason="quorum reached")
    ledger.set_subtask_state(subs[1].id, "failed", reason="retries exhausted")
    ledger.update_run("a", state="completed", epochs_completed=1)
    view = ledger.fenced("a", ledger.acquire_lease("a", "driver", 60)) if fenced else ledger

    done = view.finish_attempt(dropped.id, state="finished", result_uri="a/r0", samples=9)
    assert (done.state, done.reason) == (
        "rejected",
        "came in after its subtask was dropped: nothing merges it",
    )
    assert (done.result_uri, done.samples) == ("a/r0", 9)  # what the worker recorded is kept
    assert ledger.get_attempt(dropped.id).model_dump() == done.model_dump()  # as stored
    # An attempt given up on, alive after all, with a partial result: the same.
    late = view.finish_attempt(failed.id, state="interrupted", result_uri="a/r1", reason="notice")
    assert (late.state, late.reason) == (
        "rejected",
        "came in after its subtask was failed: nothing merges it",
    )
    # Rejected is final; only a result is rejected so; an open subtask's result is kept.
    with pytest.raises(IllegalTransition, match="'rejected' to 'finished'"):
        view.finish_attempt(dropped.id, state="finished")
    kept = view.finish_attempt(open_result.id, state="finished", result_uri="a/r2", reason="ok")
    assert (kept.state, kept.reason) == ("finished", "ok")
    crashed = ledger.start_attempt("a", 0, 2, "w-crash")
    assert view.finish_attempt(crashed.id, state="failed", reason="boom").state == "failed"
    assert [s.state for s in ledger.subtasks("a", 0)] == ["dropped", "failed", "running"]


@pytest.mark.postgres
@pytest.mark.parametrize("fenced", [False, True], ids=["fast path", "fenced"])
def test_a_finish_waits_for_a_merge_of_its_subtask_under_way(pg_url: str, fenced: bool) -> None:
    """PostgreSQL: a result that comes in while another attempt's merge holds the
    subtask waits for it and is recorded a duplicate once it commits; without the
    lock it would read the subtask before that merge and stay finished, and its
    epoch's settle, which read the attempts before it committed, would miss it."""
    import threading

    with Ledger(pg_url) as led:
        new_run(led, "a", shards=1)
        late = led.start_attempt("a", 0, 0, "w-late")
        sub_id = led.subtasks("a", 0)[0].id
        view = led.fenced("a", led.acquire_lease("a", "driver", 60)) if fenced else led
        got: list[Attempt] = []
        finish = threading.Thread(
            target=lambda: got.append(
                view.finish_attempt(late.id, state="finished", result_uri="a/r")
            )
        )
        with led._engine.connect() as merger, merger.begin():
            # What a merge's statement does: the subtask's row locked, then merged.
            merger.execute(text("SELECT id FROM subtask WHERE id = :id FOR UPDATE"), {"id": sub_id})
            merger.execute(
                text("UPDATE subtask SET state = 'merged', merged_version = 7 WHERE id = :id"),
                {"id": sub_id},
            )
            finish.start()
            finish.join(1.0)
            assert finish.is_alive() and not got, "the finish did not wait for the merge"
        finish.join(30)
        assert len(got) == 1, "the finish did not end once the merge committed"
        assert got[0].state == "duplicate" and "v7" in (got[0].reason or ""), got[0]
