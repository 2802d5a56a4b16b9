"""The ``vcdl-epoch`` subflow: one epoch's shard tasks on Dask, merged as they land.

The ledger, not Prefect or Dask, is the source of truth for what is left to
do (BOINC's transitioner): an attempt that died, timed out, failed or was
rejected is reissued up to ``fault.max_attempts``, then recorded as failed
with its reason. This does not rely on Prefect retries, which cannot fire
when the worker process running the task is gone (STACK-NOTES.md).

Recovery at the start of an epoch makes the flow safe to kill at any point:
attempts a dead driver left "running" are recorded as killed, results it left
unmerged are merged now (never trained again), and only the rest is submitted.

The barrier costs the workers as little as possible: epoch e's head is
evaluated by the driver at the start of epoch e+1, in a thread, while e+1's
first attempts train and merge (the final epoch's before the flow returns),
every Dask worker has imported the hot path before the first submission, and
the epoch subflows share one Dask client instead of closing and opening one
at each barrier (flows/cluster.py).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import queue
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from typing import Any

import dask
from distributed import KilledWorker
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State
from prefect.futures import PrefectFuture
from prefect.states import Cancelled

from flows.cluster import run_dask_client, training_slots, worker_left_at
from flows.pipeline import RunStopping, current_gate
from flows.reporting import ProgressUpdater, publish_epoch_table
from vcdl.assimilator import MERGEABLE_ATTEMPT_STATES, merge_attempt, run_head_cache
from vcdl.attempt import (
    TERMINAL_SUBTASK_STATES,
    ShardData,
    drop_checkpoint,
    load_shard,
    run_attempt,
    training_slot,
    worker_name,
)
from vcdl.budget import free_attempts
from vcdl.config import RunConfig
from vcdl.errors import EpochFailed
from vcdl.ledger import Attempt, Subtask
from vcdl.preemption import PREEMPTED, notice_received, preempted_result
from vcdl.runs import evaluate_version
from vcdl.runtime import RunRef

Key = tuple[int, int]  # (epoch, shard)
DEFERRED = "deferred"
POLL_SECONDS = 2.0
# One DEBUG record per submission, its ``created`` the driver's submit time:
# benchmarks/overhead.py listens to it to time "first dispatch" exactly.
dispatch_log = logging.getLogger("vcdl.dispatch")
#: Hand-backs from workers under notice that a subtask may see without their
#: counting as attempts. Such a worker leaves Dask's pool (vcdl/preemption.py),
#: so a subtask meets one only when it was queued there before the notice;
#: past this many the workers are not leaving, and reissuing would spin.
FREE_HANDBACKS = 20


# persist_result=False: results are small dicts the driver consumes at once;
# persisting them would write files on every (spot) worker.
@task(
    name="train-shard",
    retries=1,
    retry_delay_seconds=1,
    cache_policy=NO_CACHE,
    persist_result=False,
)
def train_shard(
    ref: RunRef, config: RunConfig, epoch: int, shard: int, base_version: int | None = None
) -> dict[str, Any]:
    """Train one attempt of (run, epoch, shard) on whichever worker runs this."""
    # Imported here: the task function is pickled by value, and a module-level
    # threading.local would go with it (it cannot be pickled).
    from distributed.worker import thread_state

    body_started = time.time()
    # The worker's spare Dask thread gets here while its other task trains
    # (flows/cluster.py): read the rows meanwhile, wait for the slot, then
    # claim the freshest head.
    data = prefetch_shard(ref, epoch, shard, config)
    prefetched = time.time()
    with training_slot(training_slots(config)):
        slot_acquired = time.time()
        if notice_received():
            # A worker under notice takes nothing new: the flow reissues
            # elsewhere. Returned, not raised: a raised exception is an ERROR
            # with a traceback in Prefect's log, and a pointless retry here.
            return preempted_result(worker_name())
        out = run_attempt(ref, epoch, shard, base_version, notice_received, config, data).to_dict()
    # Wall-clock marks (one machine's clock, or NTP-synced ones) that let the
    # driver split dispatch overhead into Dask scheduling and Prefect's engine.
    out["clock"] = {
        "dask_started": getattr(thread_state, "start_time", None),
        "body_started": body_started,
        "prefetched": prefetched,
        "slot_acquired": slot_acquired,
        "body_ended": time.time(),
    }
    return out


def prefetch_shard(ref: RunRef, epoch: int, shard: int, config: RunConfig) -> ShardData | None:
    """The subtask's rows and model read ahead, or None to let the attempt read them.

    Best effort: an attempt that reads them itself records a failure to do so
    in the ledger, against its claim, with the reason.
    """
    try:
        return load_shard(ref, epoch, shard, config)
    except Exception as exc:  # the attempt reads again, and records why it fails
        logging.getLogger(__name__).debug("prefetch of %s/%s failed: %s", epoch, shard, exc)
        return None


@task(
    name="evaluate", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE, persist_result=False
)
def evaluate_head(ref: RunRef, config: RunConfig, version: int, epoch: int) -> dict[str, Any]:
    """Evaluate a version on the test split and record it in the ledger."""
    ev = evaluate_version(ref, config, version, epoch=epoch)
    return {"version": ev.version, "accuracy": ev.accuracy, "loss": ev.loss, "samples": ev.samples}


def dispatch_phases(
    sent: float, ready: float, received: float, clock: Mapping[str, float | None]
) -> dict[str, float]:
    """Split one attempt's time outside its training body (see ``_dispatch_overhead``).

    ``sent``: the driver's submission; ``ready``: when the worker was free (not
    before ``sent``); ``received``: the result back in the driver; ``clock``:
    the task's wall-clock marks (``dask_started``, ``body_started``,
    ``prefetched``, ``slot_acquired``, ``body_ended``). Pure, for tests.
    """
    begun, started, ended = clock.get("dask_started"), clock["body_started"], clock["body_ended"]
    assert started is not None and ended is not None
    acquired = clock.get("slot_acquired") or started
    prefetched = clock.get("prefetched") or started
    if begun is None:  # not run by a Dask worker thread: all of it is "dispatch"
        return {"dispatch": max(0.0, started - ready + received - ended)}
    # The read-ahead delays the attempt only where it ran after the worker was free.
    prefetch = max(0.0, prefetched - max(started, ready))
    return {
        "queued": max(0.0, min(ready, begun) - sent) + max(0.0, acquired - started - prefetch),
        "prefetch": prefetch,
        "scheduling": max(0.0, begun - ready),
        # Prefect's engine before the body, and after it plus the return of
        # the result dict through Dask (a few hundred bytes).
        "prefect": max(0.0, started - begun) + max(0.0, received - ended),
    }


def release(future: PrefectFuture[Any]) -> None:
    """Let Dask forget a task whose result the driver has consumed.

    Dask keeps a result on its worker while any client holds the future; a
    worker killed afterwards made the scheduler run those finished tasks
    again elsewhere ("lose already computed tasks"): Prefect's engine and a
    ledger lookup for each, on the surviving workers, at every kill.
    """
    wrapped = getattr(future, "wrapped_future", None)
    if wrapped is not None:
        wrapped.release()


def _set_task_run_state(future: PrefectFuture[Any], kind: str, message: str) -> None:
    """Tell Prefect the truth about a task run its engine cannot finish (worker gone)."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    state: State[Any] = (
        Crashed(message=message) if kind == "crashed" else Cancelled(message=message)
    )
    try:
        with get_client(sync_client=True) as client:
            client.set_task_run_state(future.task_run_id, state, force=True)
    except Exception:  # the run may not exist (killed in its first second)
        pass


class EpochDriver:
    """Drives one epoch to its barrier; every decision is recorded in the ledger."""

    def __init__(
        self,
        ref: RunRef,
        cfg: RunConfig,
        epoch: int,
        final: bool,
        progress_id: str | None = None,
    ) -> None:
        self.ref, self.cfg, self.epoch, self.final = ref, cfg, epoch, final
        self.progress = ProgressUpdater(ref, progress_id, cfg.run.epochs, cfg.data.shards)
        self.ledger = ref.ledger()
        self.log = get_run_logger()
        self.cache = run_head_cache(ref, cfg)
        self.pending: dict[PrefectFuture[dict[str, Any]], Key] = {}
        self.done: queue.SimpleQueue[PrefectFuture[dict[str, Any]]] = queue.SimpleQueue()
        self.submitted: dict[Key, int] = {}
        self.submitted_at: dict[Key, float] = {}
        self.handed_back: dict[Key, int] = {}  # tasks a worker under notice returned untrained
        # When each worker last finished a task body: a task submitted while
        # its worker was busy waited in a queue, which is not dispatch overhead.
        self.worker_free_at: dict[str, float] = {}
        self.base: int | None = None
        self.tally = dict.fromkeys(
            ("merged", "duplicate", "rejected", "skipped", "errors", "reissued", "timeouts"), 0
        ) | {"killed": 0, "dropped": 0, "deferred": 0, "failed": 0}
        self.quorum_at: float | None = None
        # Set when run by flows/pipeline.py: wait for the previous epoch's
        # barrier before acting, say when only the last results are left.
        self.gate = current_gate()
        # To ask the scheduler when a killed attempt's worker died (for its bill).
        self.dask_client = run_dask_client()

    # -- bookkeeping ---------------------------------------------------------

    def _subtask(self, key: Key) -> Subtask:
        return next(s for s in self.ledger.subtasks(self.ref.run, key[0]) if s.shard == key[1])

    def _attempts(self, key: Key) -> list[Attempt]:
        """The subtask's attempts, as the ledger has them now."""
        return [a for a in self.ledger.attempts(self.ref.run, key[0]) if a.shard == key[1]]

    def _mark_running_attempts(self, key: Key, state: str, reason: str) -> int:
        n = 0
        for a in self._attempts(key):
            if a.state == "running":
                # A killed attempt ended when its worker died, not when the
                # driver found out (often after the re-run): bill it that long.
                ended = (
                    worker_left_at(a.worker, a.started_at, self.dask_client)
                    if state == "killed"
                    else None
                )
                self.ledger.finish_attempt(a.id, state=state, reason=reason, ended_at=ended)
                n += 1
        return n

    def _todo(self) -> list[Key]:
        """This epoch's unfinished subtasks, plus earlier ones deferred to it."""
        keys = []
        for s in self.ledger.subtasks(self.ref.run, exclude_states=TERMINAL_SUBTASK_STATES):
            if s.epoch == self.epoch or (s.epoch < self.epoch and s.reason == DEFERRED):
                keys.append((s.epoch, s.shard))
        return keys

    # -- the steps -------------------------------------------------------------

    def recover(self) -> None:
        """Clean up after a driver that died in this epoch."""
        # Filtered in the ledger: these run at every barrier, on every attempt
        # of the run otherwise (0.3 s per scan at 10 000 attempts on SQLite).
        for a in self.ledger.attempts(self.ref.run, states=("running",)):
            if a.epoch <= self.epoch:
                self.ledger.finish_attempt(
                    a.id, state="killed", reason="lost with a previous driver or its cluster"
                )
                self.tally["killed"] += 1
        todo = set(self._todo())
        for a in self.ledger.attempts(self.ref.run, states=MERGEABLE_ATTEMPT_STATES):
            key = (a.epoch, a.shard)
            if key in todo:
                self.log.info("merging epoch %d shard %d left by a previous driver", *key)
                self._merge(a.id, key, reissue_on_reject=False)
                todo.discard(key)

    def submit(self, key: Key) -> None:
        self.submitted[key] = self.submitted.get(key, 0) + 1
        self.submitted_at[key] = time.time()
        epoch, shard = key
        dispatch_log.debug(
            "submit epoch %d shard %d attempt %d",
            epoch,
            shard,
            self.submitted[key],
            extra={"vcdl_run": self.ref.run, "vcdl_epoch": epoch, "vcdl_shard": shard},
        )
        # Dask resources (e.g. GPU=1) ride on the task as an annotation. No
        # Prefect tags: a tagged task run asks the API for tag concurrency slots
        # before it starts, one more round trip per attempt that stalled the
        # first attempt of an epoch by seconds (benchmarks/time_to_accuracy.py).
        resources = dict(self.cfg.cluster.task_resources)
        with dask.annotate(resources=resources) if resources else contextlib.nullcontext():
            fut = train_shard.with_options(
                task_run_name=f"epoch {epoch} · shard {shard} · attempt {self.submitted[key]}",
            ).submit(self.ref, self.cfg, epoch, shard, self.base if epoch == self.epoch else None)
        self.pending[fut] = key
        # One completion callback per future, for the epoch's life: a fresh
        # as_completed() per wait registered one more on every pending future
        # (quadratic in shards) and its closures kept finished futures alive.
        fut.add_done_callback(self.done.put)

    def reissue(self, key: Key, reason: str) -> None:
        sub = self._subtask(key)
        if sub.state in TERMINAL_SUBTASK_STATES:
            return
        # Killed attempts that moved the subtask forward are free (vcdl/budget.py):
        # on a spot fleet a healthy subtask is killed again and again.
        free = free_attempts(self._attempts(key))
        # Count submissions too: a task that fails before it can claim an
        # attempt (broken worker environment) must not be reissued forever.
        # Not those a worker under notice handed back untrained: counted, four
        # such hand-backs within one grace period failed a subtask on a spot
        # fleet where every attempt that ran could have succeeded. A free
        # attempt also frees the submission it came from (one at most; Dask
        # re-runs a task on a worker's death, so one submission may have many).
        untrained = min(self.handed_back.get(key, 0), FREE_HANDBACKS)
        tries = max(sub.attempts - free, self.submitted.get(key, 0) - untrained - free)
        if tries >= self.cfg.fault.max_attempts:
            assert sub.id is not None
            spared = f" ({free} more moved it forward before their workers died)" if free else ""
            self.ledger.set_subtask_state(
                sub.id, "failed", reason=f"{tries} attempts{spared}, last: {reason}"
            )
            self.tally["failed"] += 1
            self.log.error("epoch %d shard %d failed for good: %s", key[0], key[1], reason)
            return
        self.tally["reissued"] += 1
        self.log.warning("epoch %d shard %d reissued: %s", key[0], key[1], reason)
        self.submit(key)

    def _merge(
        self,
        attempt_id: str,
        key: Key,
        reissue_on_reject: bool = True,
        overhead: dict[str, float] | None = None,
    ) -> None:
        outcome = merge_attempt(self.ref, attempt_id, self.cfg, self.cache)
        self.tally[outcome.kind] += 1
        if outcome.kind in ("merged", "rejected"):
            phases = {f"assimilator_{k}": v for k, v in outcome.timings.items()}
            self.ledger.add_timings(attempt_id, phases | (overhead or {}))
        if outcome.kind == "rejected":
            self.log.warning("epoch %d shard %d rejected: %s", key[0], key[1], outcome.reason)
            if reissue_on_reject:
                self.reissue(key, f"rejected: {outcome.reason}")
        elif outcome.kind == "merged":
            self.progress()
            self.log.info(
                "epoch %d shard %d merged as v%s (alpha %.3f, staleness %s)",
                key[0],
                key[1],
                outcome.version,
                outcome.alpha or 0.0,
                outcome.staleness,
            )

    def _lost(self, key: Key, reason: str) -> None:
        """The task brought no result (its worker died, or took nothing under notice): reissue."""
        self.tally["errors"] += 1
        self.tally["killed"] += self._mark_running_attempts(key, "killed", "worker died")
        self.reissue(key, reason)

    def _on_done(self, fut: PrefectFuture[dict[str, Any]], key: Key) -> None:
        try:
            out = fut.result()
        except KilledWorker as exc:
            # Dask gave up after `allowed-failures` worker deaths; Prefect would
            # leave the task run Running forever.
            _set_task_run_state(fut, "crashed", f"worker lost: {exc}")
            self._lost(key, "KilledWorker: the workers running it died")
            return
        except Exception as exc:
            self._lost(key, f"{type(exc).__name__}: {exc}")
            return
        if out["state"] == PREEMPTED:
            self.handed_back[key] = self.handed_back.get(key, 0) + 1
            # Recorded as a worker death; reissue's WARNING is its one line in the log.
            self._lost(key, f"handed back untrained by {out['worker']}, under preemption notice")
            return
        if out["state"] == "skipped":
            self.tally["skipped"] += 1
            return
        if out["state"] == "interrupted" and self.cfg.fault.partial == "discard":
            self.ledger.finish_attempt(
                str(out["attempt_id"]),
                state="rejected",
                reason=f"partial result ({out['samples']}/{out['planned_samples']} samples) "
                "discarded by policy fault.partial=discard",
            )
            self.tally["rejected"] += 1
            self.reissue(key, "preempted with notice; partial result discarded")
            return
        # Attempts of this subtask that Dask re-ran elsewhere left "running" rows.
        self.tally["killed"] += self._mark_running_attempts(
            key, "killed", "worker died; the task was re-run elsewhere"
        )
        self._merge(str(out["attempt_id"]), key, overhead=self._dispatch_overhead(key, out))

    def _dispatch_overhead(self, key: Key, out: dict[str, Any]) -> dict[str, float]:
        """Seconds outside the task body: queueing, Dask scheduling and Prefect's task engine.

        ``queued`` is time the attempt waited because its worker was busy (in
        Dask's queues, or started on the worker's spare thread and waiting for
        the training slot): not overhead. ``prefetch`` is the part of the
        read-ahead of the shard's rows that ran after the worker was free.
        ``scheduling`` counts from when the worker was free (its previous body
        ended) to Dask starting the task.
        ``prefect`` is the engine before and after the body; when the task
        started on the spare thread its "before" overlapped the previous
        attempt's training.
        """
        clock = out.get("clock") or {}
        sent, received = self.submitted_at.get(key), time.time()
        started, ended = clock.get("body_started"), clock.get("body_ended")
        if sent is None or started is None or ended is None:
            return {}
        worker = str(out.get("worker") or "")
        # The attempt could not train before its worker finished the previous one.
        ready = max(sent, self.worker_free_at.get(worker, sent))
        self.worker_free_at[worker] = max(ended, self.worker_free_at.get(worker, ended))
        return dispatch_phases(sent, ready, received, clock)

    def _check_deadlines(self) -> None:
        """Reissue subtasks whose running attempt is past its deadline."""
        now = datetime.now(UTC)
        for fut, key in list(self.pending.items()):
            late = [
                a
                for a in self._attempts(key)
                if a.state == "running" and a.deadline and a.deadline < now
            ]
            if not late:
                continue
            fut.wrapped_future.cancel()  # type: ignore[attr-defined]
            del self.pending[fut]
            _set_task_run_state(fut, "cancelled", "attempt past its deadline")
            for a in late:
                self.ledger.finish_attempt(a.id, state="timeout", reason="past its deadline")
            self.tally["timeouts"] += 1
            self.reissue(key, f"timeout after {self.cfg.fault.attempt_timeout:.0f}s")

    def _check_quorum(self) -> None:
        """Past the straggler deadline: leave the late shards to the next epoch or drop them."""
        f = self.cfg.fault
        if f.quorum >= 1.0 or self.final:
            return
        subs = self.ledger.subtasks(self.ref.run, self.epoch)
        merged = sum(1 for s in subs if s.state == "merged")
        if self.quorum_at is None:
            if merged >= f.quorum * len(subs):
                self.quorum_at = time.monotonic()
            return
        if time.monotonic() - self.quorum_at < f.straggler_timeout:
            return
        for fut, key in list(self.pending.items()):
            fut.wrapped_future.cancel()  # type: ignore[attr-defined]
            del self.pending[fut]
            _set_task_run_state(fut, "cancelled", f"straggler: {f.late} by quorum policy")
            self._mark_running_attempts(key, "killed", "cancelled as a straggler")
            sub = self._subtask(key)
            if sub.state in TERMINAL_SUBTASK_STATES:
                continue
            assert sub.id is not None
            if f.late == "drop":
                self.ledger.set_subtask_state(sub.id, "dropped", reason="late: quorum policy")
                self.tally["dropped"] += 1
            else:
                self.ledger.set_subtask_state(sub.id, "pending", reason=DEFERRED)
                self.tally["deferred"] += 1
        self.log.warning("epoch %d closed at quorum: stragglers %s", self.epoch, f.late)

    def drain(self) -> None:
        """Wait for results, merging each; reissue what died, timed out or was rejected."""
        checked = time.monotonic()
        while self.pending:
            try:
                fut: PrefectFuture[dict[str, Any]] | None = self.done.get(timeout=POLL_SECONDS)
            except queue.Empty:
                fut = None
            if time.monotonic() - checked >= POLL_SECONDS:
                # Also while results keep coming: one hung attempt among many.
                self._check_deadlines()
                checked = time.monotonic()
            if fut is not None and (key := self.pending.pop(fut, None)) is not None:
                self._on_done(fut, key)
                release(fut)
            self._check_quorum()
            self._tell_gate()

    def _tell_gate(self) -> None:
        """Tell the gate of flows/pipeline.py where this epoch is.

        Raises RunStopping if the run is stopping (interrupted: a resume does
        the rest); lets the next epoch's subflow set up once this one waits
        only for its last results.
        """
        if self.gate is None:
            return
        self.gate.check()
        if len(self.pending) <= self.cfg.cluster.workers:
            self.gate.tail()

    def _settle(self) -> None:
        """Results that arrived for subtasks merged from another attempt are duplicates.

        Checkpoints left by attempts of finished subtasks (killed ones nobody
        resumed, or superseded by a further one) are deleted: nothing resumes
        them any more.
        """
        store = self.ref.store()
        # Only attempts that may need settling (few at any time), and the
        # subtasks of their epochs: not every row of a long run at every barrier.
        candidates = {
            a.id: a
            for a in [
                *self.ledger.attempts(self.ref.run, states=MERGEABLE_ATTEMPT_STATES),
                *self.ledger.attempts(self.ref.run, checkpointed=True),
            ]
        }
        subtasks = [
            s
            for epoch in sorted({a.epoch for a in candidates.values()})
            for s in self.ledger.subtasks(self.ref.run, epoch)
        ]
        merged = {s.id for s in subtasks if s.state == "merged"}
        done = {s.id for s in subtasks if s.state in TERMINAL_SUBTASK_STATES}
        for a in candidates.values():
            if a.checkpoint_uri is not None and a.subtask_id in done:
                drop_checkpoint(self.ref, a.id)
            if a.state in MERGEABLE_ATTEMPT_STATES and a.subtask_id in merged:
                self.ledger.finish_attempt(
                    a.id, state="duplicate", reason="subtask merged from another attempt"
                )
                if a.result_uri:
                    store.delete(a.result_uri)
                self.tally["duplicate"] += 1

    def _unevaluated_previous(self) -> tuple[int, int] | None:
        """(epoch, version) of the previous epoch's barrier head if it has no evaluation yet.

        The barrier head is the newest version of an epoch up to e: epoch e+1's
        merges may already be in (its evaluation runs beside them, and a driver
        may have died before recording it). Exact unless shards deferred by the
        quorum policy were merged in e+1 before a driver died.
        """
        prev = self.epoch - 1
        if prev < 0 or any(
            e.epoch == prev and e.split == "test" for e in self.ledger.evaluations(self.ref.run)
        ):
            return None
        return prev, self.ledger.barrier_head(self.ref.run, prev)

    def _evaluate(self, epoch: int, version: int) -> dict[str, Any]:
        # In the driver: workers are busy training (previous epoch) or done (final).
        # The driver may have no GPU even when the workers train on one.
        cfg = (
            self.cfg.updated(train={"device": "auto"})
            if self.cfg.train.device == "cuda"
            else self.cfg
        )
        ev = evaluate_head(self.ref, cfg, version, epoch)
        publish_epoch_table(self.ref, epoch)
        self.log.info("epoch %d: head v%d, test accuracy %.4f", epoch, version, ev["accuracy"])
        return ev

    def run(self) -> dict[str, Any]:
        if self.gate is not None:
            # Nothing before the previous epoch's barrier (flows/pipeline.py).
            if self.gate.must_wait():
                self.log.info("set up; waiting for epoch %d's last results", self.epoch - 1)
            self.gate.wait_previous()
        self.ledger.ensure_subtasks(self.ref.run, self.epoch, self.cfg.data.shards)
        if self.cfg.merge.rule == "average":
            merged = [v.number for v in self.ledger.versions(self.ref.run) if v.epoch == self.epoch]
            self.base = (
                min(merged) - 1 if merged else self.ledger.get_run(self.ref.run).head_version
            )
        previous = self._unevaluated_previous()  # before recover(), which may merge
        self.recover()
        for key in self._todo():
            self.submit(key)
        self._tell_gate()  # few shards left (resumed, deferred): maybe in the tail already
        started = time.perf_counter()
        # The epoch barrier's evaluation overlaps this epoch's first attempts,
        # in a thread: neither the workers nor the merges of their results
        # wait for it (a result merged late is a staler base for the next one).
        # The thread runs in a copy of this context: Prefect's flow run context.
        with ThreadPoolExecutor(1, thread_name_prefix="vcdl-evaluate") as pool:
            evaluation = (
                pool.submit(contextvars.copy_context().run, partial(self._evaluate, *previous))
                if previous is not None
                else None
            )
            self.drain()
            if evaluation is not None:
                evaluation.result()  # raises what the evaluation raised
        subs = self.ledger.subtasks(self.ref.run, self.epoch)
        if not any(s.state == "merged" for s in subs):
            reasons = sorted({s.reason or "" for s in subs if s.state == "failed"})
            raise EpochFailed(
                f"epoch {self.epoch} of run {self.ref.run}: no shard could be merged "
                f"({'; '.join(reasons)[:500]}); fix the cause and `vcdl resume {self.ref.run}`"
            )
        self._settle()
        head = self.ledger.get_run(self.ref.run).head_version
        # The last epoch has no next one to overlap with: evaluate it now, before
        # the run counts it as done (a resumed driver then evaluates it again).
        ev = self._evaluate(self.epoch, head) if self.final else None
        self.ledger.update_run(self.ref.run, epochs_completed=self.epoch + 1)
        if self.gate is not None:
            self.gate.passed.set()  # the barrier: the next epoch may act
        self.progress(force=True)
        self.log.info(
            "epoch %d done in %.1fs: head v%d", self.epoch, time.perf_counter() - started, head
        )
        return {
            "epoch": self.epoch,
            "head_version": head,
            **self.tally,
            "test_accuracy": ev["accuracy"] if ev else None,
        }


@flow(name="vcdl-epoch")
def epoch_flow(
    ref: RunRef,
    config: RunConfig,
    epoch: int,
    final: bool = False,
    progress_id: str | None = None,
) -> dict[str, Any] | State[Any]:
    """Run every unfinished shard of one epoch and merge each result as it lands.

    ``progress_id`` is the run's progress artifact (see flows/reporting.py),
    updated as shards are merged. Run by flows/pipeline.py, it ends
    Cancelled when the run stops before or while it runs (an earlier epoch
    failed, the train flow was interrupted): a resume does the rest.
    """
    try:
        return EpochDriver(ref, config, epoch, final, progress_id).run()
    except RunStopping as exc:
        return Cancelled(message=str(exc))
