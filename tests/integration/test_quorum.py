"""The epoch barrier with a quorum: stragglers are dropped or reissued, recorded either way."""

from __future__ import annotations

from pathlib import Path

import pytest

from vcdl import api
from vcdl.config import RunConfig, parse_config
from vcdl.states import MERGEABLE_ATTEMPT_STATES
from vcdl.views.audit import audit_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def quorum_config(name: str, late: str) -> RunConfig:
    # One worker and 6 shards: once 2 are merged the other 4 are still queued
    # or training, and with a 0.01 s straggler deadline they are left behind.
    return parse_config(
        {
            "run": {"name": name, "epochs": 2, "seed": 2},
            "data": {"name": "mnist1d", "samples": 3000, "shards": 6},
            "model": {"factory": "cnn1d", "kwargs": {"width": 8}},
            "cluster": {"workers": 1},
            "fault": {"quorum": 0.3, "straggler_timeout": 0.01, "late": late},
        }
    )


def test_stragglers_dropped(prefect_api: None, tmp_path: Path) -> None:
    s = api.train(quorum_config("q-drop", "drop"), home=tmp_path)
    assert s["state"] == "completed"
    first, last = s["history"]
    assert first["dropped"] >= 1 and first["merged"] + first["dropped"] == 6
    assert last["merged"] == 6  # the final epoch always waits for every shard
    ref = api.run_ref("q-drop", home=tmp_path)
    assert audit_run(ref) == []
    # A dropped shard's attempt that was training goes on and returns its result after
    # the drop: settled at the next barrier as rejected (waste), not left "finished"
    # as if a merge were still to come.
    ledger = ref.ledger()
    dropped = {s.id for s in ledger.subtasks("q-drop") if s.state == "dropped"}
    late = [a for a in ledger.attempts("q-drop") if a.subtask_id in dropped]
    print("attempts of dropped subtasks:", [(a.shard, a.state, a.reason) for a in late])
    assert not [a for a in late if a.state in MERGEABLE_ATTEMPT_STATES], late
    assert all(a.result_uri is None or not ref.store().exists(a.result_uri) for a in late)


def test_stragglers_reissued_next_epoch(prefect_api: None, tmp_path: Path) -> None:
    s = api.train(quorum_config("q-reissue", "reissue"), home=tmp_path)
    assert s["state"] == "completed"
    # Every shard of both epochs ends merged exactly once: epoch 0's late ones in epoch 1.
    assert [h["merged"] for h in s["history"]] == [6, 6]
    assert s["head_version"] == 12
    assert audit_run(api.run_ref("q-reissue", home=tmp_path)) == []
