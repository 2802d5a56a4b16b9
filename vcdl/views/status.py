"""What a run is: the ``vcdl status`` summary, with its per-epoch history.

A read-only view of a run built from the ledger; the audit of its
invariants is :mod:`vcdl.views.audit`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from vcdl.config import RunConfig
from vcdl.ledger import Attempt, Ledger, attempt_timings, evaluation_metrics
from vcdl.views.epochs import epoch_views
from vcdl.views.goodput import (
    salvaged_attempts,
    salvaged_seconds,
)
from vcdl.worker.checkpoints import FAILURES_KEY
from vcdl.worker.speed import SPEED_KEY


def run_status(ledger: Ledger, name: str) -> dict[str, Any]:
    """The run's state, head, accuracy and per-epoch history as plain data."""
    run = ledger.get_run(name)
    cfg = RunConfig.model_validate_json(run.config)
    subtasks = ledger.subtasks(name)
    attempts = ledger.attempts(name)
    versions = ledger.versions(name)
    evals = [e for e in ledger.evaluations(name) if e.split == "test"]
    head_evals = [e for e in evals if e.version == run.head_version]
    views = epoch_views(subtasks, attempts, versions, evals)
    history = [
        {
            "epoch": v.epoch,
            "subtasks": v.subtasks,
            "merged": v.merged,
            "dropped": v.dropped,
            "failed": v.failed,
            "attempts": v.attempts,
            "version": v.version,
            "mean_staleness": v.mean_staleness,
            "test_accuracy": v.test_accuracy,
            "test_loss": v.test_loss,
            "test_metrics": dict(v.test_metrics),
            "data_bytes": v.data_bytes,
            "data_requests": v.data_requests,
            "written_bytes": v.written_bytes,
        }
        for v in views
    ]
    counts = Counter(a.state for a in attempts)
    salvaged = salvaged_attempts(attempts)
    trained = sum(v.train_seconds for v in views)
    useful = sum(v.useful_seconds for v in views)
    all_stale = [v.staleness for v in versions if v.staleness is not None]
    return {
        "run": name,
        "state": run.state,
        "epochs": cfg.run.epochs,
        "epochs_completed": run.epochs_completed,
        "head_version": run.head_version,
        "objective": cfg.train.objective,
        "test_metrics": evaluation_metrics(head_evals[-1]) if head_evals else {},
        "test_accuracy": head_evals[-1].accuracy if head_evals else None,
        "test_loss": head_evals[-1].loss if head_evals else None,
        "data": cfg.data.name,
        "model": cfg.model.factory,
        # Not a real fleet's: every reader of a summary is told (vcdl.worker.speed).
        "emulated_speeds": list(cfg.cluster.speeds),
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
        # Every attempt's, merged or not: all of it crossed the network.
        "data_bytes": sum(v.data_bytes for v in views),
        "data_requests": sum(v.data_requests for v in views),
        "written_bytes": sum(v.written_bytes for v in views),
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
    worker: not overhead), ``memory_wait`` (a slot held, waiting for the
    worker's memory: :mod:`vcdl.worker.admission`), ``scheduling`` (Dask
    handing the task to a free worker), ``prefect`` (the task engine
    around the attempt) and ``driver_queue`` (the result back, waiting for
    the driver, which was merging others); ``emulated_wait``: the part of ``train`` that an
    emulated speed waited (``cluster.speeds``); ``net_wait``: of ``read`` and
    ``write``, the seconds the worker waited on the store for its base and
    its result while holding its training slot, and ``base_read``: a base
    read in the background, beside the attempt (:mod:`vcdl.worker.basecache`).
    """
    sums: dict[str, float] = defaultdict(float)
    n = 0
    for a in attempts:
        phases = attempt_timings(a) if a.state == "merged" else {}
        if not phases:
            continue
        n += 1
        for k, v in phases.items():
            if k not in (FAILURES_KEY, SPEED_KEY):  # a count and a factor, not phases
                sums[k] += v
    return {k: sums[k] / n for k in sorted(sums)} if n else {}


def checkpoint_failures(attempts: list[Attempt]) -> int:
    """Checkpoint writes that failed, over every attempt that recorded its end."""
    return sum(int(attempt_timings(a).get(FAILURES_KEY, 0)) for a in attempts)


def listed_run(run: Any) -> dict[str, Any]:
    """A run as ``vcdl runs --json`` lists it (a row of :meth:`Ledger.list_runs`)."""
    try:
        epochs: int | None = RunConfig.model_validate_json(run.config).run.epochs
    except ValueError:  # a config an older vcdl wrote: the listing still shows the run
        epochs = None
    return {
        "name": run.name,
        "state": run.state,
        "epochs": epochs,
        "epochs_completed": run.epochs_completed,
        "head_version": run.head_version,
        "parent_run": run.parent_run,
        "parent_version": run.parent_version,
        "created_at": run.created_at.isoformat(),
        "updated_at": run.updated_at.isoformat(),
    }
