"""What a run is and whether it is sound: status summaries and the audit.

This module owns read-only views of a run built from the ledger (and, for
the audit, the store): the ``vcdl status`` summary with its per-epoch
history, and the checks of DESIGN.md §3's invariants.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from vcdl.checkpoints import FAILURES_KEY
from vcdl.config import RunConfig
from vcdl.cost import (
    salvaged_attempts,
    salvaged_seconds,
    training_seconds,
    useful_training_seconds,
)
from vcdl.errors import StoreError
from vcdl.ledger import Attempt, Ledger, attempt_timings
from vcdl.runtime import RunRef


def run_status(ledger: Ledger, name: str) -> dict[str, Any]:
    """The run's state, head, accuracy and per-epoch history as plain data."""
    run = ledger.get_run(name)
    cfg = RunConfig.model_validate_json(run.config)
    subtasks = ledger.subtasks(name)
    attempts = ledger.attempts(name)
    versions = ledger.versions(name)
    evals = [e for e in ledger.evaluations(name) if e.split == "test"]
    head_evals = [e for e in evals if e.version == run.head_version]
    by_epoch_subtasks: dict[int, Counter[str]] = defaultdict(Counter)
    for s in subtasks:
        by_epoch_subtasks[s.epoch][s.state] += 1
    by_epoch_attempts: dict[int, Counter[str]] = defaultdict(Counter)
    for a in attempts:
        by_epoch_attempts[a.epoch][a.state] += 1
    last_version: dict[int, int] = {}
    staleness: dict[int, list[int]] = defaultdict(list)
    for v in versions:
        if v.epoch is not None:
            last_version[v.epoch] = max(last_version.get(v.epoch, 0), v.number)
            if v.staleness is not None:
                staleness[v.epoch].append(v.staleness)
    eval_by_epoch = {e.epoch: e for e in evals if e.epoch is not None}
    history = []
    for epoch in sorted(set(by_epoch_subtasks) | set(eval_by_epoch)):
        ev = eval_by_epoch.get(epoch)
        stale = staleness.get(epoch, [])
        history.append(
            {
                "epoch": epoch,
                "subtasks": sum(by_epoch_subtasks[epoch].values()),
                "merged": by_epoch_subtasks[epoch]["merged"],
                "dropped": by_epoch_subtasks[epoch]["dropped"],
                "failed": by_epoch_subtasks[epoch]["failed"],
                "attempts": sum(by_epoch_attempts[epoch].values()),
                "version": last_version.get(epoch),
                "mean_staleness": sum(stale) / len(stale) if stale else None,
                "test_accuracy": ev.accuracy if ev else None,
                "test_loss": ev.loss if ev else None,
            }
        )
    counts = Counter(a.state for a in attempts)
    salvaged = salvaged_attempts(attempts)
    trained = sum(training_seconds(a) for a in attempts)
    useful = sum(useful_training_seconds(a, salvaged) for a in attempts)
    all_stale = [v.staleness for v in versions if v.staleness is not None]
    return {
        "run": name,
        "state": run.state,
        "epochs": cfg.run.epochs,
        "epochs_completed": run.epochs_completed,
        "head_version": run.head_version,
        "test_accuracy": head_evals[-1].accuracy if head_evals else None,
        "test_loss": head_evals[-1].loss if head_evals else None,
        "data": cfg.data.name,
        "model": cfg.model.factory,
        "parent_run": run.parent_run,
        "parent_version": run.parent_version,
        "attempts": dict(sorted(counts.items())),
        "kills": counts.get("killed", 0) + counts.get("timeout", 0),
        "reissues": sum(max(0, s.attempts - 1) for s in subtasks),
        "rejections": counts.get("rejected", 0),
        "duplicates": counts.get("duplicate", 0),
        "mean_staleness": sum(all_stale) / len(all_stale) if all_stale else None,
        "resumed": sum(1 for a in attempts if a.resumed_from),
        "salvaged_seconds": salvaged_seconds(attempts, salvaged),
        "checkpoint_failures": checkpoint_failures(attempts),
        "goodput": useful / trained if trained else None,
        "phases": phase_means(attempts),
        "created_at": run.created_at.isoformat(),
        "updated_at": run.updated_at.isoformat(),
        "history": history,
    }


def phase_means(attempts: list[Attempt]) -> dict[str, float]:
    """Mean seconds per phase over the merged attempts that recorded a breakdown.

    Phases (``attempt.timings``): on the worker ``claim``, ``read`` (base
    weights), ``data``, ``train`` (the training loop), ``write`` (result);
    in the assimilator ``assimilator_*`` (read result and head, merge, write
    version, ledger); measured by the driver ``queued`` (waiting for a busy
    worker: not overhead), ``scheduling`` (Dask handing the task to a free
    worker) and ``prefect`` (the task engine around the attempt).
    """
    sums: dict[str, float] = defaultdict(float)
    n = 0
    for a in attempts:
        phases = attempt_timings(a) if a.state == "merged" else {}
        if not phases:
            continue
        n += 1
        for k, v in phases.items():
            if k != FAILURES_KEY:  # a count, not a phase
                sums[k] += v
    return {k: sums[k] / n for k in sorted(sums)} if n else {}


def checkpoint_failures(attempts: list[Attempt]) -> int:
    """Checkpoint writes that failed, over every attempt that recorded its end."""
    return sum(int(attempt_timings(a).get(FAILURES_KEY, 0)) for a in attempts)


def audit_run(ref: RunRef, deep: bool = False) -> list[str]:
    """Violations of the run's invariants; an empty list means the run is sound.

    Checks: the head is a complete, checksummed version; the version chain is
    gap-free with lineage recorded; every subtask of a completed epoch was
    merged exactly once or recorded as dropped/failed; merged attempts and
    subtasks agree with the versions. ``deep`` also verifies every version's
    checksums (reads all weights).
    """
    ledger, store = ref.ledger(), ref.store()
    problems: list[str] = []
    run = ledger.get_run(ref.run)
    versions = ledger.versions(ref.run)
    numbers = [v.number for v in versions]
    if numbers != list(range(len(numbers))):
        problems.append(f"version numbers are not 0..{len(numbers) - 1} without gaps: {numbers}")
    if run.head_version != (numbers[-1] if numbers else None):
        problems.append(f"head {run.head_version} is not the newest version {numbers[-1:]}")
    subtasks = {s.id: s for s in ledger.subtasks(ref.run)}
    attempts = {a.id: a for a in ledger.attempts(ref.run)}
    per_subtask: Counter[int] = Counter()
    for v in versions:
        if v.number == 0:
            if v.parent is not None:
                problems.append("v0 has a parent")
            continue
        if v.parent != v.number - 1:
            problems.append(f"v{v.number}: parent {v.parent}, expected {v.number - 1}")
        if v.subtask_id is None or v.attempt_id is None or v.alpha is None or v.staleness is None:
            problems.append(f"v{v.number}: lineage incomplete (subtask, attempt, alpha, staleness)")
            continue
        per_subtask[v.subtask_id] += 1
        att = attempts.get(v.attempt_id)
        if att is None or att.state != "merged":
            problems.append(f"v{v.number}: attempt {v.attempt_id} is not recorded as merged")
        sub = subtasks.get(v.subtask_id)
        if sub is None or sub.state != "merged" or sub.merged_version != v.number:
            problems.append(f"v{v.number}: subtask {v.subtask_id} does not point back to it")
        if not store.exists(v.uri):
            problems.append(f"v{v.number}: group {v.uri} missing or incomplete in the store")
    for sid, n in per_subtask.items():
        if n > 1:
            s = subtasks[sid]
            problems.append(f"subtask epoch {s.epoch} shard {s.shard} merged {n} times")
    for s in subtasks.values():
        assert s.id is not None  # rows read back from the ledger have ids
        if s.epoch < run.epochs_completed and s.state not in ("merged", "dropped", "failed"):
            problems.append(f"epoch {s.epoch} shard {s.shard} is '{s.state}' in a completed epoch")
        if s.state == "merged" and per_subtask[s.id] != 1:
            problems.append(f"epoch {s.epoch} shard {s.shard} is 'merged' without one version")
    merged_attempts = Counter(a.subtask_id for a in attempts.values() if a.state == "merged")
    for sid, n in merged_attempts.items():
        if n > 1:
            problems.append(f"subtask {sid} has {n} attempts marked merged")
    if versions:
        check = versions if deep else [v for v in versions if v.number == run.head_version]
        for v in check:
            try:
                store.read_state(v.uri, verify=True)
                if store.checksum(v.uri) != v.checksum:
                    problems.append(f"v{v.number}: checksum differs from the ledger's")
            except StoreError as exc:
                problems.append(f"v{v.number}: {exc}")
    return problems
