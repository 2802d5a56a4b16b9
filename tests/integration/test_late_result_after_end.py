"""A result that lands after its run ended is recorded as a duplicate (issue 50).

A worker cut off mid-attempt comes back after its subtask was reissued and
merged elsewhere and the run completed: the driver's last settle is behind
it, so its own finish must record it. Real worker and merge code, a SQLite
ledger and a local store, no cluster: the late attempt's ``trained`` hook
(called between its training and its result's write) runs the reissue, its
merge and the run's end.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from vcdl.config import RunConfig, parse_config
from vcdl.driver.assimilator import merge_attempt
from vcdl.driver.runs import prepare_run
from vcdl.runtime import RunRef
from vcdl.views.audit import audit_run
from vcdl.worker.attempt import run_attempt
from vcdl.worker.runtime import WorkerRuntime


def make_run(home: Path) -> tuple[RunRef, RunConfig]:
    cfg = parse_config(
        {
            "run": {"name": "late", "epochs": 1, "seed": 5},
            "data": {"name": "mnist1d", "samples": 600, "shards": 2},
            "model": {"factory": "cnn1d", "kwargs": {"width": 8}},
        }
    ).with_locations(home)
    ref, _, _ = prepare_run(cfg)
    ref.ledger().ensure_subtasks(ref.run, 0, 2)
    ref.ledger().update_run(ref.run, state="running")
    return ref, cfg


def test_a_result_landing_after_the_run_ended_is_a_recorded_duplicate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VCDL_NETWORK_OVERLAP", "1")  # the hook runs where overlap hands on
    ref, cfg = make_run(tmp_path)
    ledger, store = ref.ledger(), ref.store()
    ends: dict[str, str] = {}

    def meanwhile() -> None:
        # The late attempt has trained; while its worker is cut off, the subtask
        # is reissued and merged, the other one too, and the run ends.
        for shard in (0, 1):
            other = run_attempt(ref, 0, shard, config=cfg, runtime=WorkerRuntime())
            ends[f"shard {shard}"] = merge_attempt(ref, str(other.attempt_id), cfg).kind
        ledger.update_run(ref.run, state="completed", epochs_completed=1)

    late = run_attempt(ref, 0, 0, config=cfg, runtime=WorkerRuntime(), trained=meanwhile)
    assert ends == {"shard 0": "merged", "shard 1": "merged"}
    assert late.state == "finished" and late.attempt_id  # the worker's side: no failure
    recorded = ledger.get_attempt(late.attempt_id)
    assert recorded.state == "duplicate", recorded
    assert (recorded.reason or "").startswith("subtask already merged as v1 by another attempt")
    assert recorded.samples == late.samples and recorded.result_uri is not None
    assert not store.exists(recorded.result_uri)  # nobody reads it: its worker deleted it
    # A driver that still followed the task treats it as the duplicate it is.
    assert merge_attempt(ref, late.attempt_id, cfg).kind == "duplicate"
    run = ledger.get_run(ref.run)
    assert (run.state, run.head_version) == ("completed", 2)
    assert audit_run(ref, deep=True) == []

    # What a vcdl before this left: the late result finished, nobody to settle it.
    with sqlite3.connect(ref.ledger_url.removeprefix("sqlite:///")) as db:
        db.execute("UPDATE attempt SET state = 'finished' WHERE id = ?", (late.attempt_id,))
    problems = audit_run(ref)
    assert len(problems) == 1 and f"attempt {late.attempt_id}" in problems[0], problems
    assert "merged as v1 from another attempt: a result nobody settled" in problems[0]
    # While the run goes on, its next settle records it: not a violation yet.
    ledger.update_run(ref.run, state="running")
    assert audit_run(ref) == []
