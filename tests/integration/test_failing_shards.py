"""A subtask that always fails is retried a bounded number of times, then the run fails clearly."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vcdl import api
from vcdl.config import parse_config
from vcdl.errors import EpochFailed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.alone]


def test_always_failing_attempts_are_bounded(prefect_api: None, tmp_path: Path) -> None:
    this = sys.modules[__name__]
    cfg = parse_config(
        {
            "run": {"name": "broken", "epochs": 1},
            "data": {"name": "mnist1d", "samples": 1000, "shards": 2},
            "model": {"factory": "tests.integration.broken_model:broken"},
            "cluster": {"workers": 1},
            "fault": {"max_attempts": 2},
        }
    )
    with pytest.raises(EpochFailed, match="no shard could be merged"):
        api.train(cfg, home=tmp_path)
    s = api.status("broken", home=tmp_path)
    assert s["state"] == "failed"
    assert s["history"][0]["failed"] == 2
    # Each shard: at most max_attempts submissions, each with one Prefect retry.
    assert sum(s["attempts"].values()) <= 2 * 2 * 2
    assert set(s["attempts"]) == {"failed"}
    # The run shipped tests/ (the factory's package) to its workers; the driver,
    # which runs the LocalCluster's scheduler, kept its own modules and sys.path
    # (CI once failed later tests that pickled functions of replaced modules).
    assert sys.modules[__name__] is this
    assert not [p for p in sys.path if "vcdl-code-" in p]


def test_a_hung_attempt_is_timed_out_and_its_shard_reissued(
    prefect_api: None, tmp_path: Path
) -> None:
    marker = tmp_path / "hung"
    cfg = parse_config(
        {
            "run": {"name": "hung", "epochs": 1},
            "data": {"name": "mnist1d", "samples": 1000, "shards": 4},
            "model": {
                "factory": "tests.integration.broken_model:hangs_once",
                "kwargs": {"marker": str(marker), "seconds": 12},
            },
            "cluster": {"workers": 2},
            "fault": {"attempt_timeout": 3},
        }
    )
    api.train(cfg, home=tmp_path / "home")
    assert marker.exists(), "one attempt hung"
    s = api.status("hung", home=tmp_path / "home")
    assert s["state"] == "completed" and s["history"][0]["merged"] == 4
    # The driver gave up on it past its deadline and reissued the shard, whose
    # new attempt merged; the hung one came back late, recorded as a duplicate.
    assert s["attempts"] == {"merged": 4, "duplicate": 1}, s["attempts"]
    attempts = api.run_ref("hung", home=tmp_path / "home").ledger().attempts("hung")
    hung = next(a for a in attempts if a.state == "duplicate")
    assert hung.finished_at is not None and hung.started_at is not None
    assert (hung.finished_at - hung.started_at).total_seconds() >= 12
    again = next(a for a in attempts if a.shard == hung.shard and a.state == "merged")
    assert again.started_at is not None
    # Reissued once past the deadline (3 s), long before the hung one returned.
    assert 3 <= (again.started_at - hung.started_at).total_seconds() < 12
