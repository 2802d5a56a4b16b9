"""One attempt of one subtask, as a worker runs it: ledger → store → train → store → ledger.

This module owns the worker side of the hot path (DESIGN.md §2): claim an
attempt in the ledger (which fixes its base version), read the base weights
and only this shard's rows, train, write the result group, and record the
outcome. It is what the Prefect shard task calls; it knows nothing of Prefect
or Dask, so it runs the same in a test, a thread or a remote worker.

Safe to run twice: an attempt for a subtask that is already merged (a retry
or a duplicate that arrives late) is recorded and skipped without training.

It also owns the worker process's training slots (:func:`training_slot`): a
worker may run more tasks than it trains at once, so that the orchestrator's
per-task work for the next attempt overlaps the current one's training; and
the short wait that keeps such a next attempt from claiming a head without
the worker's own last result (:func:`await_own_merge`).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np
import torch

from vcdl.assimilator import MERGEABLE_ATTEMPT_STATES
from vcdl.config import RunConfig
from vcdl.data import open_dataset, read_rows, shard_indices
from vcdl.errors import LedgerError
from vcdl.models import build_model
from vcdl.runtime import RunRef, result_path
from vcdl.train import train_attempt

TERMINAL_SUBTASK_STATES = frozenset({"merged", "dropped", "failed"})

_SLOTS: dict[int, threading.Semaphore] = {}
_SLOTS_LOCK = threading.Lock()

# Per run, this process's last recorded result the driver may not have merged yet.
_UNMERGED: dict[str, str] = {}
OWN_MERGE_WAIT = 1.0
"""Seconds an attempt waits at most for the previous result of its process to be merged."""


@contextmanager
def training_slot(slots: int | None) -> Iterator[None]:
    """Hold one of this process's ``slots`` places to train, waiting while all are taken.

    A worker with one Dask thread more than it has slots starts the next task
    while the current one trains: Prefect's engine sets the next task up in
    the meantime (~0.1 s of CPU per task, seconds on a loaded machine), and
    the next attempt claims its base version the moment the slot frees, not
    earlier, so it still trains from the freshest head. With as many threads
    as slots it never waits; ``None`` means no limit.
    """
    if slots is None:
        yield
        return
    with _SLOTS_LOCK:
        slot = _SLOTS.setdefault(slots, threading.Semaphore(slots))
    with slot:
        yield


def await_own_merge(ref: RunRef, timeout: float = OWN_MERGE_WAIT, poll: float = 0.02) -> float:
    """Wait until this process's previous result of the run left the ledger's "finished" state.

    VC-ASGD trains from the head at claim time. A worker that starts its next
    attempt the moment it recorded the previous one (the spare Dask thread)
    claimed a head without its own last result, which the driver merges tens
    of milliseconds later: every result one version staler (MNIST-1D, 4
    epochs: mean staleness 1.7 instead of 0.6, test accuracy 4-5 points lower).
    Waiting is bounded by ``timeout``: a busy or dead driver costs that much
    once, not the run. Returns the seconds waited.
    """
    last = _UNMERGED.pop(ref.run, None)
    if last is None:
        return 0.0
    ledger = ref.ledger()
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if ledger.get_attempt(last).state not in MERGEABLE_ATTEMPT_STATES:
                break
        except LedgerError:  # the row is gone (the run was deleted)
            break
        time.sleep(poll)
    return time.monotonic() - started


@dataclass
class AttemptOutcome:
    """What the shard task returns to the flow: ids and numbers, never tensors."""

    attempt_id: str | None
    epoch: int
    shard: int
    state: str
    """finished, skipped (subtask already done) or interrupted (partial result)."""
    base_version: int | None = None
    samples: int = 0
    planned_samples: int = 0
    loss: float | None = None
    train_seconds: float = 0.0
    worker: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per phase: claim, read, data, train, write, record."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def worker_name() -> str:
    """The Dask worker's address when inside one, else host:pid."""
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except (ImportError, ValueError):
        return f"{socket.gethostname()}:{os.getpid()}"


def attempt_seed(seed: int, epoch: int, shard: int) -> int:
    """Deterministic per subtask, so a reissued attempt trains like the first."""
    return int(np.random.SeedSequence([seed, epoch, shard]).generate_state(1)[0])


def _unmerged_result(ref: RunRef, epoch: int, shard: int) -> AttemptOutcome | None:
    """A finished, not yet merged attempt of this subtask whose result is stored."""
    store = ref.store()
    for a in ref.ledger().attempts(ref.run, epoch):
        if (
            a.shard == shard
            and a.state == "finished"
            and a.result_uri
            and store.exists(a.result_uri)
        ):
            return AttemptOutcome(
                attempt_id=a.id,
                epoch=epoch,
                shard=shard,
                state="finished",
                base_version=a.base_version,
                samples=a.samples or 0,
                loss=a.loss,
                train_seconds=a.train_seconds or 0.0,
                worker=a.worker,
                timings={"reused": 1.0},
            )
    return None


def run_attempt(
    ref: RunRef,
    epoch: int,
    shard: int,
    base_version: int | None = None,
    should_stop: Callable[[], bool] | None = None,
    config: RunConfig | None = None,
) -> AttemptOutcome:
    """Claim, train and record one attempt of subtask (run, epoch, shard).

    ``base_version`` None means "the head at claim time" (VC-ASGD); the
    averaging rule pins every shard of an epoch to the epoch's first version.
    """
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    ledger = ref.ledger()
    store = ref.store()
    cfg = config if config is not None else ref.config()
    subtask = next((s for s in ledger.subtasks(ref.run, epoch) if s.shard == shard), None)
    if subtask is None:
        raise LookupError(f"run {ref.run!r} has no subtask epoch {epoch} shard {shard}")
    if subtask.state in TERMINAL_SUBTASK_STATES:
        return AttemptOutcome(None, epoch, shard, "skipped", worker=worker_name())
    done = _unmerged_result(ref, epoch, shard)
    if done is not None:
        # Dask re-runs a finished task whose worker died before the driver
        # fetched its return value; the result is safe in the store already.
        return done
    # Not part of the claim's time: the worker is idle meanwhile, and shows so.
    awaited = await_own_merge(ref) if base_version is None else 0.0
    deadline = datetime.now(UTC) + timedelta(seconds=cfg.fault.attempt_timeout)
    attempt = ledger.start_attempt(
        ref.run, epoch, shard, worker_name(), base_version=base_version, deadline=deadline
    )
    timings["claim"] = time.perf_counter() - t0 - awaited
    if awaited:
        timings["await_merge"] = awaited
    try:
        t = time.perf_counter()
        base_row = ledger.get_version(ref.run, attempt.base_version)
        base = store.read_state(base_row.uri)
        timings["read"] = time.perf_counter() - t

        t = time.perf_counter()
        info = open_dataset(store, cfg.data.name)
        rows = shard_indices(info.n_train, cfg.data.shards, cfg.run.seed, epoch, shard)
        x, y = read_rows(store, cfg.data.name, "train", rows)
        timings["data"] = time.perf_counter() - t

        # Set deliberately: Nanny-started workers default to 1 thread, and
        # set_num_threads is process-wide, so the config decides, not history.
        torch.set_num_threads(cfg.train.threads)
        model = build_model(
            cfg.model.factory,
            cfg.model.kwargs,
            input_shape=info.input_shape,
            num_classes=info.num_classes,
        )
        result = train_attempt(
            model,
            base,
            x,
            y,
            cfg.train,
            seed=attempt_seed(cfg.run.seed, epoch, shard),
            should_stop=should_stop,
        )
        timings["train"] = result.train_seconds

        t = time.perf_counter()
        path = result_path(ref.run, epoch, shard, attempt.id)
        store.write_state(
            path,
            result.state,
            attrs={
                "run": ref.run,
                "epoch": epoch,
                "shard": shard,
                "attempt": attempt.id,
                "base_version": attempt.base_version,
                "samples": result.samples,
                "planned_samples": result.planned_samples,
            },
        )
        timings["write"] = time.perf_counter() - t

        t = time.perf_counter()
        state = "interrupted" if result.interrupted else "finished"
        ledger.finish_attempt(
            attempt.id,
            state=state,
            result_uri=path,
            samples=result.samples,
            loss=result.mean_loss,
            train_seconds=result.train_seconds,
            reason="stopped at a batch boundary by a preemption notice"
            if result.interrupted
            else None,
            # "record" itself cannot be in the row it writes; it is in the outcome.
            timings=timings,
        )
        timings["record"] = time.perf_counter() - t
        _UNMERGED[ref.run] = attempt.id
    except BaseException as exc:
        # Record the failure while the process is alive; a SIGKILL never gets
        # here, which is what attempt deadlines are for.
        try:
            ledger.finish_attempt(attempt.id, state="failed", reason=f"{type(exc).__name__}: {exc}")
        finally:
            raise
    return AttemptOutcome(
        attempt_id=attempt.id,
        epoch=epoch,
        shard=shard,
        state=state,
        base_version=attempt.base_version,
        samples=result.samples,
        planned_samples=result.planned_samples,
        loss=result.mean_loss,
        train_seconds=result.train_seconds,
        worker=attempt.worker,
        timings=timings,
    )
