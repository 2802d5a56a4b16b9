"""Memory admission in a real LocalCluster: a worker with two training slots but memory for
one attempt of a 100-MB model trains them one at a time, and the wait is recorded.

Without the gate such a worker starts every slot at once; with 8 slots on a
4-GiB worker that livelocked (Dask restarted it at 95 % each time its
attempts wrote their results; benchmarks/fleet.py, docs/results.md). The
control run, admission off, waits for nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.sleeper import sleeper_config, write_sleeper_data
from vcdl import api
from vcdl.config import RunConfig, parse_config
from vcdl.ledger import attempt_timings
from vcdl.runtime import open_ledger

pytestmark = [pytest.mark.slow, pytest.mark.alone]

SHARDS = 4
SECONDS = 2.0


@pytest.fixture(autouse=True)
def _allow_the_sleeper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VCDL_ALLOW_IMPORTS", "vcdl.models.synthetic")


def _train(home: Path, admission: float, limit: str = "2GB") -> list[dict[str, float]]:
    raw = sleeper_config("gate", epochs=1, shards=SHARDS, params=25e6, seconds=SECONDS)
    raw["merge"]["result_precision"] = "int8_delta"  # an estimate of 7 copies: 0.7 GB
    raw["cluster"] = {
        "workers": 1,
        "threads_per_worker": 2,
        # 0.7 of 2 GB, 1.4 GB, holds the worker's ~0.4 GB and one attempt (0.7 GB), not two
        "memory_limit": limit,
        "memory_admission": admission,
    }
    cfg: RunConfig = parse_config(raw).with_locations(home)
    write_sleeper_data(cfg, "tests: memory admission")
    summary = api.train(cfg, home=home)
    assert summary["state"] == "completed", summary
    assert cfg.ledger.url is not None
    attempts = open_ledger(cfg.ledger.url).attempts("gate")
    assert sorted(a.shard for a in attempts if a.state == "merged") == list(range(SHARDS))
    # No restart by Dask's memory monitor: every shard took one attempt.
    assert len(attempts) == SHARDS, [(a.shard, a.state, a.reason) for a in attempts]
    return [attempt_timings(a) for a in attempts]


def test_a_worker_short_of_memory_trains_one_attempt_at_a_time(tmp_path: Path) -> None:
    gated = _train(tmp_path / "gated", 0.7)
    waits = [t.get("memory_wait", 0.0) for t in gated]
    # Each of the second slot's attempts waits for the other's training.
    assert sum(w >= SECONDS / 2 for w in waits) >= SHARDS // 2 - 1, waits

    # The control: admission off (and memory for both, else Dask restarts the
    # worker as both write their results), the slots train together.
    free = _train(tmp_path / "free", 0.0, limit="4GB")
    assert all(t.get("memory_wait", 0.0) < 0.5 for t in free), free
