"""Retention on a real ledger and store: what a run keeps, what gc deletes, and a gc killed
mid-way (SIGKILL) then re-run.

Attempts run in this process (no cluster: retention lives in the ledger, the
store and vcdl.driver.gc); a killed attempt is what the driver records of
one (running -> killed, with a checkpoint a replacement resumes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vcdl.cli import main
from vcdl.config import RunConfig, parse_config
from vcdl.driver.assimilator import merge_attempt
from vcdl.driver.gc import collect
from vcdl.driver.runs import prepare_run
from vcdl.runtime import RunRef
from vcdl.store.paths import checkpoint_path, results_prefix, versions_prefix
from vcdl.views.audit import audit_run
from vcdl.worker.attempt import run_attempt

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def make_run(tmp_path: Path, keep: dict[str, object] | None = None) -> tuple[RunRef, RunConfig]:
    cfg = parse_config(
        {
            "run": {"name": "keep", "epochs": 2, "seed": 3},
            "data": {"name": "digits", "shards": 4},
            "model": {"factory": "mlp", "kwargs": {"hidden": [16]}},
            "train": {"batch_size": 50},
            # The delta rule reads every result's base: the policy must keep it.
            "merge": {"rule": "delta"},
            "store": {"keep": keep or {}},
        }
    ).with_locations(tmp_path)
    ref, _, _ = prepare_run(cfg)
    return ref, cfg


def train_and_merge(ref: RunRef, cfg: RunConfig, epoch: int, shard: int) -> int:
    out = run_attempt(ref, epoch, shard, config=cfg)
    outcome = merge_attempt(ref, str(out.attempt_id), cfg)
    assert outcome.kind == "merged", outcome
    assert outcome.version is not None
    return outcome.version


def kept_on_store(ref: RunRef) -> set[int]:
    names = ref.store().list(versions_prefix(ref.run))
    return {int(n.split("-", 1)[0]) for n in names}


def pruned_in_ledger(ref: RunRef) -> set[int]:
    return {v.number for v in ref.ledger().versions(ref.run) if v.pruned_at is not None}


def cli(*argv: str) -> tuple[int, str, str]:
    """`vcdl ARGV` in this process: exit code, stdout, stderr."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def test_a_run_with_a_kill_and_a_resume_keeps_exactly_what_the_policy_says(
    tmp_path: Path,
) -> None:
    ref, cfg = make_run(tmp_path)
    ledger, store = ref.ledger(), ref.store()
    ledger.ensure_subtasks(ref.run, 0, 4)
    assert [train_and_merge(ref, cfg, 0, s) for s in (0, 1)] == [1, 2]

    # Shard 2's worker is killed after a checkpoint: the driver records it killed.
    dead = ledger.start_attempt(ref.run, 0, 2, "dead-worker")
    assert dead.base_version == 2
    ckpt = checkpoint_path(ref.run, 0, 2, dead.id, 100)
    store.write_state(ckpt, store.read_state(ledger.get_version(ref.run, 2).uri))
    ledger.record_checkpoint(dead.id, ckpt, 100, 0.5)
    ledger.abandon_attempt(dead.id, state="killed", reason="test: worker killed")

    assert train_and_merge(ref, cfg, 0, 3) == 3
    report = collect(ref, cfg)
    # v2 is the killed attempt's base: its replacement resumes the checkpoint from it.
    assert report.kept == [0, 2, 3] and report.pruned == [1]
    assert kept_on_store(ref) == {0, 2, 3} and pruned_in_ledger(ref) == {1}
    assert store.exists(ckpt)

    # The resume: shard 2's replacement starts from the checkpoint, and the delta
    # rule reads its base (v2) to merge it.
    resumed = run_attempt(ref, 0, 2, config=cfg)
    assert ledger.get_attempt(str(resumed.attempt_id)).resumed_from == dead.id
    assert merge_attempt(ref, str(resumed.attempt_id), cfg).version == 4
    report = collect(ref, cfg)
    assert report.kept == [0, 4] and report.pruned == [2, 3]
    assert not store.exists(ckpt) and store.list(results_prefix(ref.run)) == []
    ledger.update_run(ref.run, epochs_completed=1)

    # Epoch 1: its end (v8, the head) and epoch 0's end (v4) stay, with v0.
    ledger.ensure_subtasks(ref.run, 1, 4)
    for s in range(4):
        train_and_merge(ref, cfg, 1, s)
    ledger.update_run(ref.run, epochs_completed=2)
    report = collect(ref, cfg)
    assert report.kept == [0, 4, 8] and report.pruned == [5, 6, 7]
    assert kept_on_store(ref) == {0, 4, 8}
    assert pruned_in_ledger(ref) == {1, 2, 3, 5, 6, 7}
    # Lineage stays: every pruned row keeps its parent, alpha, staleness, checksum.
    for v in ledger.versions(ref.run):
        assert v.number == 0 or (v.parent == v.number - 1 and v.alpha is not None)
        assert v.checksum
    assert audit_run(ref, deep=True) == []

    # A pruned version cannot be exported or evaluated: one line, exit 2, no file.
    out = tmp_path / "v5.pt"
    code, _, err = cli(
        "export", ref.run, "--home", str(tmp_path), "--version", "5", "--out", str(out)
    )
    assert code == 2 and "pruned" in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
    code, _, err = cli("evaluate", ref.run, "--home", str(tmp_path), "--version", "6")
    assert code == 2 and "pruned" in err, err
    # A kept one exports as before.
    code, _, _ = cli(
        "export", ref.run, "--home", str(tmp_path), "--version", "4", "--out", str(out)
    )
    assert code == 0 and out.exists()
    # Nothing left to do: gc frees nothing.
    code, text, _ = cli("gc", ref.run, "--home", str(tmp_path), "--json")
    assert code == 0 and json.loads(text)["bytes_freed"] == 0
    # Never beside a live driver: a lease held elsewhere refuses gc (a dry run still reports).
    ref.ledger().acquire_lease(ref.run, "elsewhere:1:abcdef", 60.0)
    code, _, err = cli("gc", ref.run, "--home", str(tmp_path))
    assert code == 1 and "being driven by elsewhere:1:abcdef" in err, err
    code, _, _ = cli("gc", ref.run, "--home", str(tmp_path), "--dry-run")
    assert code == 0
    ref.ledger().release_lease(ref.run, "elsewhere:1:abcdef")


# A `vcdl gc` process that SIGKILLs itself after two deletions: a kill mid-way.
KILLED_GC = """
import os, signal, sys
from vcdl.store import WeightStore
deleted = []
plain = WeightStore.delete
def delete(self, path):
    plain(self, path)
    deleted.append(path)
    if len(deleted) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
WeightStore.delete = delete
from vcdl.cli import main
main(sys.argv[1:])
"""


def test_gc_killed_mid_way_then_rerun_ends_consistent(tmp_path: Path) -> None:
    # Trained keeping everything (today's behaviour), then collected under the default.
    ref, cfg = make_run(tmp_path, keep={"all": True})
    ledger = ref.ledger()
    for epoch in (0, 1):
        ledger.ensure_subtasks(ref.run, epoch, 4)
        for s in range(4):
            train_and_merge(ref, cfg, epoch, s)
        ledger.update_run(ref.run, epochs_completed=epoch + 1)
    assert collect(ref, cfg).pruned == []  # `all`: nothing goes
    assert kept_on_store(ref) == set(range(9))
    ledger.update_run(ref.run, config=cfg.updated(store={"keep": {"all": False}}).model_dump_json())

    code, text, _ = cli("gc", ref.run, "--home", str(tmp_path), "--dry-run", "--json")
    planned = json.loads(text)
    assert code == 0 and planned["pruned"] == [1, 2, 3, 5, 6, 7] and planned["bytes_freed"] > 0
    assert kept_on_store(ref) == set(range(9)) and pruned_in_ledger(ref) == set()  # dry

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_GC, "gc", ref.run, "--home", str(tmp_path)],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    # Killed after marking and two deletions (v1's group, v1's absent rule state):
    # every version is marked, some bytes are left; the ledger offers none of them.
    assert pruned_in_ledger(ref) == {1, 2, 3, 5, 6, 7}
    left = kept_on_store(ref) - {0, 4, 8}
    assert left and 1 not in left
    assert audit_run(ref) == []
    code, _, err = cli(
        "export",
        ref.run,
        "--home",
        str(tmp_path),
        "--version",
        "5",
        "--out",
        str(tmp_path / "x.pt"),
    )
    assert code == 2 and "pruned" in err

    # Re-run: it finishes the job.
    code, text, _ = cli("gc", ref.run, "--home", str(tmp_path), "--json")
    report = json.loads(text)
    assert code == 0 and report["pruned"] == [] and sorted(report["finished"]) == sorted(left)
    assert report["bytes_freed"] > 0
    assert kept_on_store(ref) == {0, 4, 8}
    assert audit_run(ref, deep=True) == []
    code, text, _ = cli("audit", ref.run, "--home", str(tmp_path))
    assert code == 0 and "ok" in text
    code, text, _ = cli("gc", ref.run, "--home", str(tmp_path), "--dry-run")
    assert code == 0 and "would prune 0 version(s), would free 0 B" in text
