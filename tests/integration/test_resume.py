"""A killed attempt's last checkpoint is where its replacement starts.

The worker is a real process SIGKILLed mid-training (no cluster: the guarantee
lives in ``run_attempt`` and the ledger). Its replacement must claim the killed
attempt's base, train only the samples the checkpoint had not seen, and leave
a result that merges like any other.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from vcdl.config import RunConfig, parse_config
from vcdl.driver.assimilator import merge_attempt
from vcdl.driver.runs import prepare_run
from vcdl.ledger import Attempt
from vcdl.runtime import RunRef
from vcdl.worker.attempt import attempt_seed, run_attempt
from vcdl.worker.loop import train_attempt
from vcdl.worker.shard_data import load_shard

pytestmark = [pytest.mark.timeout(120), pytest.mark.alone]

WORKER = """
import sys
from vcdl.worker.attempt import attempt_seed, run_attempt
from vcdl.worker.shard_data import load_shard
from vcdl.runtime import RunRef
from vcdl.worker.loop import train_attempt
run_attempt(RunRef.model_validate_json(sys.argv[1]), 0, 0)
"""


def make_run(tmp_path: Path, checkpoint_seconds: float) -> tuple[RunRef, RunConfig]:
    cfg = parse_config(
        {
            "run": {"name": "resume", "epochs": 1, "seed": 5},
            "data": {"name": "mnist1d", "samples": 2000, "shards": 1},
            "model": {"factory": "cnn1d", "kwargs": {"width": 32}},
            # Batches of 10 over 1 600 rows, 20 times: long enough to be killed.
            "train": {"batch_size": 10, "local_epochs": 20},
            "fault": {"checkpoint_seconds": checkpoint_seconds},
        }
    ).with_locations(tmp_path)
    ref, _, _ = prepare_run(cfg)
    ref.ledger().ensure_subtasks(ref.run, 0, 1)
    return ref, cfg


def _only(ref: RunRef) -> Attempt:
    (attempt,) = ref.ledger().attempts(ref.run, 0)
    return attempt


def _kill_after_checkpoints(ref: RunRef, n: int) -> Attempt:
    """Start a worker process, SIGKILL it once its attempt has ``n`` checkpoints' worth."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", WORKER, ref.model_dump_json()], env=env)
    try:
        deadline = time.monotonic() + 90
        seen: set[str] = set()
        while time.monotonic() < deadline:
            attempts = ref.ledger().attempts(ref.run, 0)
            if attempts and attempts[0].checkpoint_uri:
                seen.add(attempts[0].checkpoint_uri)
                if len(seen) >= n:
                    break
            assert proc.poll() is None, "the worker ended before it was killed"
            time.sleep(0.02)
        else:
            pytest.fail(f"no {n} checkpoints within 90 s")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return _only(ref)


def test_replacement_resumes_from_the_last_checkpoint(tmp_path: Path) -> None:
    ref, cfg = make_run(tmp_path, checkpoint_seconds=0.3)
    killed = _kill_after_checkpoints(ref, 2)
    assert killed.state == "running"  # SIGKILL: nobody recorded its end
    assert killed.checkpoint_uri is not None and killed.samples and killed.train_seconds
    planned = 1600 * 20
    assert 0 < killed.samples < planned

    store = ref.store()
    checkpoint = store.read_state(killed.checkpoint_uri)

    out = run_attempt(ref, 0, 0, config=cfg)
    new = ref.ledger().get_attempt(str(out.attempt_id))
    assert new.resumed_from == killed.id
    assert new.resumed_seconds == killed.train_seconds  # the training it took over
    assert new.base_version == killed.base_version
    # The result has seen the whole shard: the checkpoint's samples and its own.
    assert out.state == "finished" and out.samples == planned == new.samples
    # It is exactly the checkpoint trained on the batches it had not seen.
    data = load_shard(ref, 0, 0, cfg)
    expected = train_attempt(
        data.model,
        checkpoint,
        data.arrays,
        cfg.train,
        seed=attempt_seed(cfg.run.seed, 0, 0),
        objective=data.objective,
        start_samples=killed.samples,
    )
    assert new.result_uri is not None
    result = store.read_state(new.result_uri)
    for k, v in expected.state.items():
        torch.testing.assert_close(result[k], v, rtol=0, atol=0)
    # The checkpoints are gone (the result supersedes them); the result merges.
    assert new.checkpoint_uri is None and not store.exists(killed.checkpoint_uri)
    assert ref.ledger().get_attempt(killed.id).checkpoint_uri is None
    outcome = merge_attempt(ref, str(out.attempt_id), cfg)
    assert outcome.kind == "merged" and outcome.staleness == 0


def test_without_checkpoints_the_replacement_starts_over(tmp_path: Path) -> None:
    ref, cfg = make_run(tmp_path, checkpoint_seconds=0)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", WORKER, ref.model_dump_json()], env=env)
    try:
        deadline = time.monotonic() + 60
        while not ref.ledger().attempts(ref.run, 0) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    killed = _only(ref)
    assert killed.checkpoint_uri is None and killed.samples is None
    cfg_short = cfg.model_copy(update={"train": cfg.train.model_copy(update={"local_epochs": 1})})
    out = run_attempt(ref, 0, 0, config=cfg_short)
    assert ref.ledger().get_attempt(str(out.attempt_id)).resumed_from is None


@pytest.mark.parametrize("damage", ["deleted", "overlapping records", "unknown format"])
def test_an_unreadable_checkpoint_is_not_resumed(tmp_path: Path, damage: str) -> None:
    ref, cfg = make_run(tmp_path, checkpoint_seconds=0.3)
    killed = _kill_after_checkpoints(ref, 1)
    assert killed.checkpoint_uri is not None
    if damage == "deleted":
        ref.store().delete(killed.checkpoint_uri)
    else:
        # What a dying worker (or disk) may leave: a group that cannot be read.
        doc_path = Path(ref.store().uri(killed.checkpoint_uri)) / "zarr.json"
        doc = json.loads(doc_path.read_bytes())
        vcdl = doc["attributes"]["vcdl"]
        if damage == "overlapping records":
            for rec in vcdl["tensors"].values():
                rec["offset"] = 0
        else:
            vcdl["format"] = 99
        doc_path.write_text(json.dumps(doc))
    cfg_short = cfg.model_copy(update={"train": cfg.train.model_copy(update={"local_epochs": 1})})
    out = run_attempt(ref, 0, 0, config=cfg_short)
    assert ref.ledger().get_attempt(str(out.attempt_id)).resumed_from is None
    assert out.samples == 1600


def test_slow_checkpoint_writes_overlap_training_and_leave_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A store that takes 0.25 s per checkpoint (a big model on S3, scaled
    # down). Written in line, every write would stop the training loop.
    from vcdl.store import WeightStore
    from vcdl.worker.checkpoints import CheckpointWriter

    spent: list[float] = []
    plain = WeightStore.write_state

    def slow(self: WeightStore, path: str, *args: object, **kwargs: object) -> object:
        if "-ckpt" not in path:
            return plain(self, path, *args, **kwargs)  # type: ignore[arg-type]
        t = time.perf_counter()
        time.sleep(0.25)
        out = plain(self, path, *args, **kwargs)  # type: ignore[arg-type]
        spent.append(time.perf_counter() - t)
        return out

    # What the training loop spends handing a checkpoint over.
    handoffs: list[float] = []
    hand_over = CheckpointWriter.__call__

    def timed(self: CheckpointWriter, *args: object) -> None:
        t = time.perf_counter()
        hand_over(self, *args)  # type: ignore[arg-type]
        handoffs.append(time.perf_counter() - t)

    monkeypatch.setattr(WeightStore, "write_state", slow)
    monkeypatch.setattr(CheckpointWriter, "__call__", timed)
    ref, cfg = make_run(tmp_path, checkpoint_seconds=0.05)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"local_epochs": 6})})
    out = run_attempt(ref, 0, 0, config=cfg)
    assert out.state == "finished" and len(spent) >= 3, spent
    # Training handed over more checkpoints than were written (only the
    # newest waits) and never waited for a write.
    assert len(handoffs) > len(spent)
    assert sum(handoffs) < 0.1 * sum(spent), (handoffs, spent)
    assert out.timings["checkpoint"] >= sum(spent) * 0.9
    # The checkpoint in flight at the end was recorded, then dropped with the rest.
    attempt = ref.ledger().get_attempt(str(out.attempt_id))
    assert attempt.checkpoint_uri is None
    names = ref.store().list("runs/resume/results")
    assert names and not [n for n in names if "-ckpt" in n], names  # the result alone


def test_failed_checkpoint_writes_reach_the_ledger_and_the_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A store that refuses every checkpoint (a full disk, a revoked S3 key):
    # training goes on, and the run's status says that kills now cost more.
    from vcdl.cli.runs import print_summary
    from vcdl.ledger import attempt_timings
    from vcdl.store import WeightStore
    from vcdl.views.status import phase_means, run_status
    from vcdl.worker.checkpoints import FAILURES_KEY

    plain = WeightStore.write_state

    def refuse(self: WeightStore, path: str, *args: object, **kwargs: object) -> object:
        if "-ckpt" in path:
            raise OSError(28, "No space left on device")
        return plain(self, path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(WeightStore, "write_state", refuse)
    ref, cfg = make_run(tmp_path, checkpoint_seconds=0.02)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"local_epochs": 3})})
    out = run_attempt(ref, 0, 0, config=cfg)
    assert out.state == "finished" and out.samples == 3 * 1600
    failed = out.timings[FAILURES_KEY]
    assert failed >= 1
    attempt = ref.ledger().get_attempt(str(out.attempt_id))
    assert attempt.checkpoint_uri is None
    assert attempt_timings(attempt)[FAILURES_KEY] == failed
    assert merge_attempt(ref, str(out.attempt_id), cfg).kind == "merged"
    summary = run_status(ref.ledger(), ref.run)
    assert summary["checkpoint_failures"] == int(failed)
    assert FAILURES_KEY not in summary["phases"]  # a count, not seconds
    assert FAILURES_KEY not in phase_means(ref.ledger().attempts(ref.run))
    print_summary(summary, as_json=False)
    assert f"warning: {int(failed)} checkpoint write(s) failed" in capsys.readouterr().out


def test_a_worker_carries_its_optimizer_between_attempts_when_asked(tmp_path: Path) -> None:
    from vcdl.worker.runtime import WorkerRuntime

    cfg = parse_config(
        {
            "run": {"name": "carry", "epochs": 2, "seed": 5},
            "data": {"name": "mnist1d", "samples": 1000, "shards": 1},
            "model": {"factory": "cnn1d", "kwargs": {"width": 8}},
            "train": {"batch_size": 100, "optimizer_state": "worker"},
        }
    ).with_locations(tmp_path)
    ref, _, _ = prepare_run(cfg)
    steps = 8  # 800 training rows in batches of 100
    worker = WorkerRuntime()  # one worker process's state, handed to each attempt
    for epoch in range(2):
        ref.ledger().ensure_subtasks(ref.run, epoch, 1)
        outcome = run_attempt(ref, epoch, 0, runtime=worker)
        assert outcome.attempt_id is not None
        merge_attempt(ref, outcome.attempt_id, cfg)
        kept = worker.optimizer[ref.run]
        # The second attempt's Adam continued the first's: its step count runs on.
        assert int(kept["state"][0]["step"]) == steps * (epoch + 1)

    fresh = cfg.updated(run={"name": "fresh"}, train={"optimizer_state": "fresh"})
    ref2, _, _ = prepare_run(fresh)
    ref2.ledger().ensure_subtasks(ref2.run, 0, 1)
    run_attempt(ref2, 0, 0, runtime=worker)
    assert ref2.run not in worker.optimizer
