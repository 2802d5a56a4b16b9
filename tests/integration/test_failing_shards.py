"""A subtask that always fails is retried a bounded number of times, then the run fails clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from vcdl import api
from vcdl.config import parse_config
from vcdl.errors import EpochFailed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_always_failing_attempts_are_bounded(prefect_api: None, tmp_path: Path) -> None:
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
