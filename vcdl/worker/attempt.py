"""One attempt of one subtask, as a worker runs it: ledger → store → train → store → ledger.

This module owns the worker side of the hot path (docs/design.md §2): claim an
attempt in the ledger (which fixes its base version), read the base weights
and only this shard's rows, train, write the result group, and record the
outcome. It is what the Prefect shard task calls; it knows nothing of Prefect
or Dask, so it runs the same in a test, a thread or a remote worker.

Safe to run twice: an attempt for a subtask that is already merged (a retry
or a duplicate that arrives late) is recorded and skipped without training.

What an attempt leaves for the next in the same process (the optimizer's
state, EASGD's own variable, the result whose merge the next awaits) is kept
in the :class:`~vcdl.worker.runtime.WorkerRuntime` handed to it; the worker
process's training slots and its wait for its own last merge are
:mod:`vcdl.worker.slots`.

The shard's rows and model are :mod:`vcdl.worker.shard_data`'s, the base
weights' read :mod:`vcdl.worker.baseread`'s.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import numpy as np
import torch

from vcdl.config import RunConfig
from vcdl.data.stream import ByteCounter
from vcdl.driver.merge_plan import SIZE_SHARE
from vcdl.errors import StoreError
from vcdl.ledger import Attempt
from vcdl.merge.codec import encode
from vcdl.merge.rules import rule_of
from vcdl.runtime import RunRef
from vcdl.states import RESUMABLE_ATTEMPT_STATES, TERMINAL_SUBTASK_STATES
from vcdl.store import WeightStore
from vcdl.store.paths import checkpoint_path, result_path
from vcdl.types import StateDict
from vcdl.worker.basecache import overlap_enabled
from vcdl.worker.baseread import NET_WAIT_KEY, start_base_read
from vcdl.worker.checkpoints import FAILURES_KEY, CheckpointWriter
from vcdl.worker.loop import train_attempt
from vcdl.worker.replay_inputs import replay_inputs
from vcdl.worker.runtime import CARRIED_FROM, WorkerRuntime, current_runtime
from vcdl.worker.shard_data import ShardData, load_shard
from vcdl.worker.slots import await_own_merge
from vcdl.worker.speed import SPEED_KEY, WAIT_KEY, speed_of

if TYPE_CHECKING:
    from distributed import Worker


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
    """Seconds per phase: claim, read, data (or data_ahead: read ahead), train, write, record;
    net_wait: of read and write, the seconds it waited on the store holding its slot."""
    data_bytes: int = 0
    """Bytes of training data this attempt fetched from the store."""
    written_bytes: int = 0
    """Bytes of tensors it wrote: its result and checkpoints."""
    reused: bool = False
    """An earlier finished attempt's stored result, handed to the merge again; nothing trained."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _dask_worker() -> Worker | None:
    """The Dask worker this code runs in; None outside one."""
    try:
        from distributed import get_worker

        return get_worker()
    except (ImportError, ValueError):
        return None


def worker_name() -> str:
    """The Dask worker's address when inside one, else host:pid."""
    worker = _dask_worker()
    return str(worker.address) if worker is not None else f"{socket.gethostname()}:{os.getpid()}"


def dask_worker_name() -> str | None:
    """The Dask worker's name when inside one (a LocalCluster's number, ``dask worker
    --name``'s; Dask names an unnamed worker by its address), else None.

    What outlives the worker's address (a restart, a resumed driver's new local
    cluster): the throughput plan measures and pins workers by it.
    """
    worker = _dask_worker()
    return str(worker.name) if worker is not None else None


def attempt_seed(seed: int, epoch: int, shard: int) -> int:
    """Deterministic per subtask, so a reissued attempt trains like the first."""
    return int(np.random.SeedSequence([seed, epoch, shard]).generate_state(1)[0])


def _unmerged_result(store: WeightStore, earlier: list[Attempt]) -> AttemptOutcome | None:
    """A finished, not yet merged attempt of this subtask whose result is stored."""
    for a in earlier:
        if a.state == "finished" and a.result_uri and store.exists(a.result_uri):
            return AttemptOutcome(
                attempt_id=a.id,
                epoch=a.epoch,
                shard=a.shard,
                state="finished",
                base_version=a.base_version,
                samples=a.samples or 0,
                loss=a.loss,
                train_seconds=a.train_seconds or 0.0,
                worker=a.worker,
                reused=True,
            )
    return None


def state_bytes(state: StateDict) -> int:
    """Bytes of a state dict's tensors: what writing it stores, before any codec's framing."""
    return sum(t.numel() * t.element_size() for t in state.values())


def resume_point(store: WeightStore, earlier: list[Attempt]) -> tuple[Attempt, StateDict] | None:
    """The furthest checkpoint an unfinished attempt of this subtask left, read and verified.

    ``earlier``: the subtask's attempts so far. A "running" one belongs to a
    worker Dask gave up on (dead, or leaving under a preemption notice while
    its thread still finishes: it may then record a result too, and one of
    the two is a duplicate) or to one the driver gave up on (past its
    deadline, then "timeout"); "killed" ones are dead. Their
    checkpoints are durable: resuming from one loses only the training after
    it. A checkpoint deleted meanwhile (its attempt wrote a newer one) or
    unreadable (failing its checksums, a malformed record table) is passed
    over; None means start over.
    """
    candidates = [
        a for a in earlier if a.state in RESUMABLE_ATTEMPT_STATES and a.checkpoint_uri and a.samples
    ]
    for a in sorted(candidates, key=lambda a: a.samples or 0, reverse=True):
        assert a.checkpoint_uri is not None
        try:
            return a, store.read_state(a.checkpoint_uri)
        except StoreError:  # missing, torn, corrupt or malformed: a dying worker's output
            continue
    return None


def drop_checkpoint(ref: RunRef, attempt_id: str) -> None:
    """Forget and delete an attempt's checkpoint (a result or a resumer superseded it)."""
    uri = ref.ledger(fenced=False).clear_checkpoint(attempt_id)
    if uri is not None:
        ref.store().delete(uri)


def _close_writer(writer: CheckpointWriter, timings: dict[str, float]) -> None:
    waited = writer.close()
    if writer.written or writer.failed:
        # Background seconds: they overlapped training, unlike the wait.
        timings["checkpoint"] = writer.write_seconds
    if writer.failed:
        # Only the worker's log said so before: a store that refuses
        # checkpoints silently turns every kill back into a full re-run.
        timings[FAILURES_KEY] = float(writer.failed)
    if waited > 0.001:
        timings["checkpoint_wait"] = waited


def run_attempt(
    ref: RunRef,
    epoch: int,
    shard: int,
    base_version: int | None = None,
    should_stop: Callable[[], bool] | None = None,
    config: RunConfig | None = None,
    data: ShardData | None = None,
    runtime: WorkerRuntime | None = None,
    trained: Callable[[], None] | None = None,
) -> AttemptOutcome:
    """Claim, train and record one attempt of subtask (run, epoch, shard).

    ``base_version`` None means "the head at claim time" (VC-ASGD); the
    averaging rule pins every shard of an epoch to the epoch's first version.
    ``data`` is the subtask's :func:`load_shard`, when the caller read it
    ahead; without it (or for another subtask) the attempt reads its own.
    ``runtime`` is the worker process's state the attempt reads and leaves
    (:mod:`vcdl.worker.runtime`); without it, the Dask worker's this thread
    runs on, else a fresh one: outside a worker, an attempt carries nothing
    over from another unless both are handed the same runtime.

    The base is read in the background while the model is built and the rows
    read, and a pinned base (``base_version`` given) is kept for the worker's
    next shard of the epoch (:mod:`vcdl.worker.basecache`; ``VCDL_NETWORK_OVERLAP=0``:
    read here, in turn). ``trained`` is called once training has ended and
    before the result is written (the caller hands the training slot on);
    the result is still durable in the store before the attempt is recorded.
    """
    if runtime is None:
        runtime = current_runtime() or WorkerRuntime()
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    ledger = ref.ledger(fenced=False)  # the claim alone is fenced (lease=, below)
    store = ref.store()
    cfg = config if config is not None else ref.config()
    # The subtask's own rows, filtered in the query (the epoch's lists cost O(shards)
    # rows an attempt: 7 ms of CPU at 256 shards against 1 ms at 8, measured).
    subtask = next(iter(ledger.subtasks(ref.run, epoch, shard=shard)), None)
    if subtask is None:
        raise LookupError(f"run {ref.run!r} has no subtask epoch {epoch} shard {shard}")
    if subtask.state in TERMINAL_SUBTASK_STATES:
        return AttemptOutcome(None, epoch, shard, "skipped", worker=worker_name())
    earlier = ledger.attempts(ref.run, epoch, shard=shard)
    done = _unmerged_result(store, earlier)
    if done is not None:
        # Dask re-runs a finished task whose worker died before the driver
        # fetched its return value; the result is safe in the store already.
        return done
    t = time.perf_counter()
    resume = resume_point(store, earlier) if cfg.fault.checkpoint_seconds else None
    resumed = time.perf_counter() - t
    # Not part of the claim's time: the worker is idle meanwhile, and shows so.
    awaited = (
        await_own_merge(runtime.unmerged, ref) if base_version is None and resume is None else 0.0
    )
    deadline = datetime.now(UTC) + timedelta(seconds=cfg.fault.attempt_timeout)
    attempt = ledger.start_attempt(
        ref.run,
        epoch,
        shard,
        worker_name(),
        # A resumed checkpoint carries its attempt's base: staleness counts from there.
        base_version=resume[0].base_version if resume else base_version,
        deadline=deadline,
        lease=ref.lease,  # refused if the driver that sent this has lost the run
        worker_name=dask_worker_name(),
    )
    timings["claim"] = time.perf_counter() - t0 - awaited - resumed
    if awaited:
        timings["await_merge"] = awaited
    overlap = overlap_enabled()
    own_checkpoint = False
    written = ByteCounter()  # result and checkpoints, from the writer's thread too
    writer: CheckpointWriter | None = None
    version_state: StateDict | None = None
    variable_from: str | None = None  # EASGD: the attempt whose result is the own variable
    variable_alpha: float | None = None
    try:
        t = time.perf_counter()
        if resume is not None:
            source, base = resume
            ledger.mark_resumed(attempt.id, source.id, source.train_seconds)
            start_samples = source.samples or 0
            timings["read"] = resumed + time.perf_counter() - t
        else:
            start_samples = 0
            # Under way while the model is built and the rows read (below).
            reading, fresh = start_base_read(
                ref,
                runtime,
                attempt.base_version,
                base_version is not None,
                overlap,
                (ref.run, epoch, shard),
            )
            timings["read"] = time.perf_counter() - t

        def save(state: StateDict, samples: int, seconds: float) -> None:
            """Make the training so far durable; a replacement resumes here after a kill.

            Runs in the writer's thread while training goes on.
            """
            nonlocal own_checkpoint
            path = checkpoint_path(ref.run, epoch, shard, attempt.id, samples)
            store.write_state(
                path,
                state,
                attrs={"run": ref.run, "attempt": attempt.id, "samples": samples},
            )
            # The uri to delete: the checkpoint this one replaces, or this one
            # itself if the attempt is no longer running (then never recorded).
            written.add(state_bytes(state), 0)
            stale = ledger.record_checkpoint(attempt.id, path, samples, seconds)
            own_checkpoint = own_checkpoint or stale != path
            if stale is not None:
                store.delete(stale)

        writer = CheckpointWriter(save)

        if data is None or data.key != (ref.run, epoch, shard):
            data = load_shard(ref, epoch, shard, cfg)
            timings["data"] = data.seconds
        else:
            timings["data_ahead"] = data.seconds  # read before the training slot

        if resume is None:
            t = time.perf_counter()
            base, waited = reading.wait()
            net_wait = waited if overlap else reading.read_seconds
            if overlap and (fresh or reading.owner == (ref.run, epoch, shard)):
                # Read in the background (from the claim, or ahead of it for this
                # attempt): what it took, beside what the attempt waited.
                timings["base_read"] = reading.read_seconds
            version_state = base  # what a reduced-precision result is encoded against
            rule = rule_of(cfg)
            if rule.worker_variable:
                # EASGD: this worker's own variable, pulled towards the head it read.
                alpha = rule.alpha(epoch, cfg.run.epochs, 0, 0) or 0.0
                variable = runtime.own_result.pop(ref.run, None)
                if variable is not None:
                    variable_from, variable_alpha = variable[0], alpha
                base = rule.start(base, variable[1] if variable else None, alpha)
            timings["read"] += time.perf_counter() - t
        else:
            net_wait = 0.0

        # Set deliberately: Nanny-started workers default to 1 thread, and
        # set_num_threads is process-wide, so the config decides, not history.
        torch.set_num_threads(cfg.train.threads)
        keep_optimizer = cfg.train.optimizer_state == "worker"
        speed = speed_of(
            getattr(runtime.worker, "name", None) if runtime.worker is not None else None,
            cfg.cluster.speeds,
        )
        # Taken, not shared: the optimizer updates these tensors in place,
        # and a concurrent attempt in this process must not see them move.
        carried = runtime.optimizer.pop(ref.run, None) if keep_optimizer else None
        seed = attempt_seed(cfg.run.seed, epoch, shard)
        ledger.record_replay_inputs(
            attempt.id,
            replay_inputs(
                cfg,
                seed=seed,
                start_samples=start_samples,
                optimizer_from=carried.get(CARRIED_FROM) if carried else None,
                variable_from=variable_from,
                variable_alpha=variable_alpha,
            ),
        )
        result = train_attempt(
            data.model,
            base,
            data.arrays,
            cfg.train,
            seed=seed,
            objective=data.objective,
            should_stop=should_stop,
            start_samples=start_samples,
            checkpoint=writer,
            checkpoint_seconds=(
                (lambda: writer.interval(floor, cfg.fault.checkpoint_write_ratio))
                if (floor := cfg.fault.checkpoint_seconds)
                else None
            ),
            optimizer_state=carried,
            speed=speed,
        )
        timings["train"] = result.train_seconds
        if speed < 1.0:
            timings[WAIT_KEY] = result.emulated_wait
            timings[SPEED_KEY] = speed
        if keep_optimizer and result.optimizer_state is not None:
            runtime.optimizer[ref.run] = {**result.optimizer_state, CARRIED_FROM: attempt.id}
        if rule_of(cfg).worker_variable:
            runtime.own_result[ref.run] = (attempt.id, result.state)
        handed_on = trained is not None and overlap
        if trained is not None and overlap:
            trained()  # the next attempt may train while this result is written

        t = time.perf_counter()
        write_wait = 0.0
        path = result_path(ref.run, epoch, shard, attempt.id)
        precision = cfg.merge.result_precision
        stored = result.state
        if precision != "full":
            # The change from the base *version* (the driver has it), not from
            # where training started (a checkpoint, EASGD's own variable).
            if version_state is None:
                t_read = time.perf_counter()
                row = ledger.get_version(ref.run, attempt.base_version)
                version_state = store.read_state(row.uri, expect=row.checksum)
                write_wait += time.perf_counter() - t_read
            stored = encode(result.state, version_state, precision)
        t_store = time.perf_counter()
        store.write_state(
            path,
            stored,
            attrs={
                "encoding": precision,
                "run": ref.run,
                "epoch": epoch,
                "shard": shard,
                "attempt": attempt.id,
                "base_version": attempt.base_version,
                "samples": result.samples,
                "planned_samples": result.planned_samples,
                **({SIZE_SHARE: data.size_share} if data.size_share is not None else {}),
            },
        )
        write_wait += time.perf_counter() - t_store
        # A write after the slot was handed on idles no training: not a wait of the worker's.
        timings[NET_WAIT_KEY] = net_wait + (0.0 if handed_on else write_wait)
        written.add(state_bytes(stored), 0)
        timings["write"] = time.perf_counter() - t
        # A checkpoint still being written (it overlapped the result's write)
        # is recorded before the result, so the drop below deletes it.
        _close_writer(writer, timings)

        t = time.perf_counter()
        state = "interrupted" if result.interrupted else "finished"
        recorded = ledger.finish_attempt(
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
            # A stream's bytes were fetched during training; a cached split's at load.
            data_bytes=data.counter.bytes,
            data_requests=data.counter.requests,
            written_bytes=written.bytes,
        )
        timings["record"] = time.perf_counter() - t
        if recorded.state in ("duplicate", "rejected"):
            # Another attempt's result of this subtask was merged first, or the
            # subtask was closed without a merge (dropped, failed): the ledger
            # recorded this one so, nobody will read it (`vcdl gc` deletes it
            # if this cannot). The driver's merge says why.
            with contextlib.suppress(StoreError):
                store.delete(path)
        else:
            runtime.unmerged[ref.run] = attempt.id
        # The result supersedes the checkpoints it grew from.
        if own_checkpoint:
            drop_checkpoint(ref, attempt.id)
        if resume is not None:
            drop_checkpoint(ref, resume[0].id)
    except BaseException as exc:
        # Record the failure while the process is alive; a SIGKILL never gets
        # here, which is what attempt deadlines are for.
        try:
            if writer is not None:
                _close_writer(writer, timings)
            own = data.counter if data is not None and data.key == (ref.run, epoch, shard) else None
            ledger.finish_attempt(
                attempt.id,
                state="failed",
                reason=f"{type(exc).__name__}: {exc}",
                # What it read and wrote before failing was paid for all the same.
                data_bytes=own.bytes if own is not None else None,
                data_requests=own.requests if own is not None else None,
                written_bytes=written.bytes,
            )
            if own_checkpoint:  # a failed attempt is not resumed
                drop_checkpoint(ref, attempt.id)
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
        data_bytes=data.counter.bytes,
        written_bytes=written.bytes,
    )
