"""A real run with ``cluster.overlap_epochs`` on an uneven LocalCluster (speeds 1, 0.25).

Each epoch's shards start in the previous epoch's tail: the fast worker trains
epoch e+1 while the slow one still trains epoch e's last shard. What must hold
(docs/uneven-fleets.md): an attempt of a later epoch starts before the earlier
epoch's last merge, yet every version of epoch e+1 comes after every version of
epoch e (results wait for the barrier); every subtask merged exactly once; the
audit is clean; the run replays bit for bit from its ledger.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vcdl import api
from vcdl.config import parse_config
from vcdl.replay.runner import replay_run
from vcdl.views.audit import audit_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EPOCHS = 3


def test_the_next_epoch_starts_in_the_tail_and_merges_after_the_barrier(
    prefect_api: None, tmp_path: Path
) -> None:
    cfg = parse_config(
        {
            "run": {"name": "overlap", "epochs": EPOCHS, "seed": 5},
            "data": {"name": "digits", "shards": 2},
            "model": {"factory": "mlp"},
            "train": {"lr": 0.05, "batch_size": 16, "local_epochs": 2},
            "cluster": {"workers": 2, "speeds": [1, 0.25], "overlap_epochs": True},
        }
    )
    summary = api.train(cfg, home=tmp_path / "home")
    assert summary["state"] == "completed", summary

    ref = api.run_ref("overlap", home=tmp_path / "home")
    ledger = ref.ledger()
    subtasks = ledger.subtasks("overlap")
    attempts = ledger.attempts("overlap")
    versions = [v for v in ledger.versions("overlap") if v.subtask_id is not None]
    assert len(subtasks) == 2 * EPOCHS and all(s.state == "merged" for s in subtasks)
    merged = sorted(v.subtask_id or 0 for v in versions)
    assert merged == sorted(s.id or 0 for s in subtasks)  # each exactly once

    epoch_of = {s.id: s.epoch for s in subtasks}
    order = [epoch_of[v.subtask_id] for v in sorted(versions, key=lambda v: v.number)]
    assert order == sorted(order), f"a version of a later epoch before an earlier one: {order}"
    last_merge = {
        e: max(v.created_at for v in versions if epoch_of[v.subtask_id] == e) for e in range(EPOCHS)
    }
    early = [a for a in attempts if a.epoch >= 1 and a.started_at < last_merge[a.epoch - 1]]
    print(f"attempts started before the previous epoch's last merge: {len(early)}")
    assert early, "no attempt of a later epoch started before the earlier epoch's last merge"

    assert audit_run(ref, deep=True) == []
    report = replay_run(ref)
    assert report.divergence is None, report.divergence
    assert report.bit_for_bit and report.versions == ledger.head("overlap").number
