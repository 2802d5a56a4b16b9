"""A real run with ``cluster.sizing = "throughput"`` on an uneven LocalCluster (speeds 1, 0.25):
the first epoch is even, the later ones sized by the throughput the ledger measured and
pinned to their workers; every sample is trained once per epoch; the audit is clean and
the run replays bit for bit. Its driver is killed in the last epoch once that epoch's plan
is recorded, and ``vcdl resume`` carries out the recorded plan on a new cluster: each shard
on the worker of the name it was pinned to, at that worker's new address."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from benchmarks.cli_proc import log_tail, reap, start_vcdl
from vcdl import api
from vcdl.data import open_dataset, shard_plan
from vcdl.driver.throughput import throughput_by_worker
from vcdl.errors import LedgerNotFound
from vcdl.ledger import Ledger, attempt_timings
from vcdl.replay.runner import replay_run
from vcdl.worker.speed import SPEED_KEY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

VCDL = str(Path(sys.executable).parent / "vcdl")

CONFIG = """
[run]
name = "sized"
epochs = 3
seed = 3
[data]
name = "digits"
shards = 2
[model]
factory = "mlp"
[train]
lr = 0.05
batch_size = 16
local_epochs = 2
[cluster]
workers = 2
speeds = [1, 0.25]
sizing = "throughput"
"""


def _killed_once_its_last_plan_is_recorded(home: Path, config: Path, env: dict[str, str]) -> None:
    """``vcdl train``, SIGKILLed (its cluster with it) once epoch 2's plan is in the ledger."""
    driver = start_vcdl(home, "train", str(config), env=env)
    try:
        db = home / "ledger.db"
        db_url = f"sqlite:///{db}"
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            assert driver.poll() is None, log_tail(home, "train")
            if db.exists():
                # The file made, its schema maybe not yet.
                with contextlib.suppress(LedgerNotFound), Ledger(db_url, create=False) as ledger:
                    if ledger.find_run("sized") and any(
                        s.rows is not None for s in ledger.subtasks("sized", 2)
                    ):
                        return
            time.sleep(0.2)
        raise AssertionError("epoch 2 was never planned: " + log_tail(home, "train"))
    finally:
        reap(driver)
        driver.wait(30)


def test_later_epochs_follow_the_measured_throughput_through_a_killed_driver(
    prefect_api_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "sized.toml"
    config.write_text(CONFIG)
    home = tmp_path / "home"
    env = os.environ | {"PREFECT_API_URL": prefect_api_url}
    # Killed in the last epoch, once its plan is recorded: the resumed driver (a new
    # cluster, new worker addresses) carries out that plan, not a new one.
    _killed_once_its_last_plan_is_recorded(home, config, env)
    killed_at = datetime.now(UTC)
    out = subprocess.run(
        [VCDL, "resume", "sized", "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=500,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]

    ref = api.run_ref("sized", home=home)
    ledger, store, cfg = ref.ledger(), ref.store(), ref.config()
    n = open_dataset(store, "digits").n_train
    subtasks = ledger.subtasks("sized")
    attempts = ledger.attempts("sized")
    merged = [a for a in attempts if a.state == "merged"]
    slow = {a.worker_name for a in merged if SPEED_KEY in attempt_timings(a) and a.epoch < 2}
    assert len(slow) == 1, "the slow worker trained"

    # Epoch 0 is even (nothing measured yet): no plan recorded.
    assert all(s.rows is None and s.worker is None for s in subtasks if s.epoch == 0)
    for epoch in (1, 2):
        plan = sorted((s for s in subtasks if s.epoch == epoch), key=lambda s: s.shard)
        sizes = [s.rows for s in plan]
        assert all(r is not None for r in sizes) and sum(r or 0 for r in sizes) == n
        # The sizes follow the throughput measured before the epoch, to the row.
        measured = throughput_by_worker(a for a in attempts if a.epoch < epoch)
        fast_shard = next(s for s in plan if s.worker not in slow)
        slow_shard = next(s for s in plan if s.worker in slow)
        ratio = (fast_shard.rows or 0) / (slow_shard.rows or 1)
        expected = measured[fast_shard.worker or ""] / measured[slow_shard.worker or ""]
        assert ratio == pytest.approx(expected, rel=0.02)
        assert ratio > 1, f"the fast worker's shard is not larger: {sizes}"
        # Each shard ran on its pinned worker and trained exactly its planned rows.
        for s in plan:
            ours = [a for a in merged if a.epoch == epoch and a.shard == s.shard]
            assert len(ours) == 1, [
                (a.epoch, a.shard, a.state, a.worker, a.samples, a.reason) for a in attempts
            ] + [(t.epoch, t.shard, t.state, t.rows, t.worker, t.reason) for t in subtasks]
            (a,) = ours
            # On its planned worker, known by name: the resumed driver's new cluster
            # has it on a new address and pins the shard to it there.
            assert a.worker_name == s.worker, (a, s)
            assert a.samples == (s.rows or 0) * cfg.train.local_epochs
        rows = shard_plan(n, 2, cfg.run.seed, epoch, block=None, sizes=[r or 0 for r in sizes])
        assert np.array_equal(np.sort(np.concatenate(rows)), np.arange(n))

    before = {a.worker for a in attempts if a.started_at < killed_at}
    after = [(a.shard, a.worker_name, a.worker) for a in merged if a.started_at >= killed_at]
    print(f"merged after the resume (shard, worker name, address): {after}")
    assert after, "nothing was left for the resumed driver"
    assert not {address for _, _, address in after} & before, "not a new cluster"

    # Every sample of every epoch trained once: the merged attempts' samples add up.
    for epoch in range(3):
        trained = sum(a.samples or 0 for a in merged if a.epoch == epoch)
        assert trained == n * cfg.train.local_epochs

    audit = subprocess.run(
        [VCDL, "audit", "sized", "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert audit.returncode == 0, audit.stdout[-2000:] + audit.stderr[-2000:]

    # The driver weighed each result by the size its worker wrote beside it; the replay
    # weighs it by the plan in the ledger: bit for bit only if the two agree.
    report = replay_run(ref)
    assert report.divergence is None, report.divergence
    assert report.bit_for_bit and report.versions == ledger.head("sized").number
