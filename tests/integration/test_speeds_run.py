"""A LocalCluster run with emulated speeds, from the CLI: the slow worker's attempts wait,
the fast worker's do not, and the start line and the summary say the speeds are emulated."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vcdl import api
from vcdl.ledger import attempt_timings
from vcdl.worker.speed import SPEED_KEY, WAIT_KEY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

VCDL = str(Path(sys.executable).parent / "vcdl")

CONFIG = """
[run]
name = "uneven"
epochs = 1
seed = 3
[data]
name = "digits"
shards = 6
[model]
factory = "mlp"
[train]
lr = 0.05
batch_size = 16
local_epochs = 2
[cluster]
workers = 2
speeds = [1, 0.25]
"""


def test_a_slow_worker_waits_and_every_output_says_so(prefect_api_url: str, tmp_path: Path) -> None:
    config = tmp_path / "uneven.toml"
    config.write_text(CONFIG)
    home = tmp_path / "home"
    out = subprocess.run(
        [VCDL, "train", str(config), "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=500,
        env=os.environ | {"PREFECT_API_URL": prefect_api_url},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "on 2 local workers (speeds emulated: 1, 0.25)" in out.stderr
    assert "workers ran at emulated speeds (1, 0.25)" in out.stdout

    ref = api.run_ref("uneven", home=home)
    merged = [attempt_timings(a) for a in ref.ledger().attempts("uneven") if a.state == "merged"]
    slow = [t for t in merged if SPEED_KEY in t]
    fast = [t for t in merged if SPEED_KEY not in t]
    assert slow and fast, "both workers trained"
    for t in slow:
        assert t[SPEED_KEY] == 0.25
        assert 0.5 < t[WAIT_KEY] / t["train"] < 0.9
    assert all(WAIT_KEY not in t for t in fast)

    # The slow worker trained its shards about 4x as long (the rest of an attempt,
    # reading and writing, is not slowed: a slow instance's disk and network are
    # another matter).
    def mean_train(ts: list[dict[str, float]]) -> float:
        return sum(t["train"] for t in ts) / len(ts)

    assert mean_train(slow) > 2.5 * mean_train(fast)


def test_speeds_that_do_not_match_the_workers_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[cluster]\nworkers = 2\nspeeds = [1, 0.5, 0.25]\n")
    out = subprocess.run(
        [VCDL, "train", str(config), "--home", str(tmp_path / "h")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) <= 3
    assert "cluster.speeds lists 3 speed(s) for 2 local worker(s)" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "h").exists()
