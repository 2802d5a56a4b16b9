"""The ``vcdl-epoch`` subflow: carries out one epoch's decisions on Dask, Prefect and the ledger.

The decisions are :class:`vcdl.driver.epoch_state.EpochState`'s (pure: which
shard to submit, reissue, merge, fail, drop or defer); :class:`EpochExecutor`
turns each instruction into a call — a shard task on Dask, a merge by the
assimilator, a ledger write, a Prefect state — and feeds what happened back
as the next event. The ledger, not Prefect or Dask, is the source of truth
for what is left to do: an attempt that died, timed out, failed or was
rejected is reissued up to ``fault.max_attempts``; Prefect retries cannot
fire when the worker process running the task is gone (docs/stack.md).

Recovery at the start of an epoch makes the flow safe to kill at any point:
the executor hands the state machine what a dead driver left (attempts still
"running", results not merged) and it decides.

The barrier costs the workers as little as possible: epoch e's head is
evaluated by the driver at the start of epoch e+1, in a thread, while e+1's
first attempts train and merge (the final epoch's before the flow returns);
the epoch subflows share one Dask client and are pipelined
(flows/workarounds/).

It decides nothing: each instruction type maps to one call (:meth:`EpochExecutor._do`).
The decisions no attempt row shows (a :class:`Note`: a task handed back under
notice, a reissue and its reason; a :class:`Close`) it records in the ledger
as it carries them out, one small insert each on the fault path, for ``vcdl
story``; a failure to record one is said once and never fails the run.
Longer than ~500 lines on purpose: one executor carries out every kind of
instruction of the state machine; the decisions themselves live elsewhere,
what a returned task means (its event, its dispatch phases) in
:mod:`flows.epoch_returns`, what is tidied (late duplicates, late results
of closed subtasks, checkpoints, versions) in :mod:`flows.epoch_tidy`, the
stall report in :mod:`flows.epoch_stall`, and the throughput plan's pins
in :mod:`flows.epoch_pins`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import queue
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from typing import Any

import dask
from prefect import flow, get_run_logger
from prefect.client.schemas.objects import State
from prefect.futures import PrefectFuture
from prefect.states import Cancelled

from flows.cluster import worker_left_at
from flows.epoch_pins import ShardPins
from flows.epoch_returns import DispatchClock, task_event
from flows.epoch_stall import StallWatch, check_stall
from flows.epoch_tidy import prune_versions, settle_results
from flows.reporting import ProgressUpdater, publish_epoch_table
from flows.tasks import evaluate_head, train_shard
from flows.workarounds.shared_runner import run_dask_client
from flows.workarounds.task_runs import cancel, release, set_task_run_state
from vcdl.config import RunConfig
from vcdl.driver.assimilator import MergeOutcome, merge_attempt
from vcdl.driver.epoch_events import (
    Abandon,
    AbandonRunning,
    Advance,
    AtBarrier,
    AttemptFact,
    AwaitEvaluation,
    Cancel,
    Close,
    DeadlinePassed,
    EpochPolicy,
    Evaluate,
    Event,
    FailEpoch,
    Gathered,
    Instruction,
    Key,
    MarkCrashed,
    Merge,
    MergeDone,
    MergeGroup,
    Note,
    Opened,
    Prune,
    Reject,
    Say,
    Settle,
    StartEarly,
    Submit,
    TaskReturned,
    Tick,
    fact,
)
from vcdl.driver.epoch_loop import RunStopping, current_gate
from vcdl.driver.epoch_state import EpochState
from vcdl.driver.fold import merge_attempts
from vcdl.driver.head_cache import run_head_cache
from vcdl.errors import EpochFailed, LeaseLost
from vcdl.merge.rules import rule_of
from vcdl.metrics.exporter import note_event, note_kill
from vcdl.objectives import objective_for
from vcdl.runtime import RunRef
from vcdl.states import MERGEABLE_ATTEMPT_STATES, TERMINAL_SUBTASK_STATES
from vcdl.views import observe
from vcdl.views.epochs import format_metrics

POLL_SECONDS = 2.0
# One DEBUG record per submission, its ``created`` the driver's submit time:
# benchmarks/overhead.py listens to it to time "first dispatch" exactly.
dispatch_log = logging.getLogger("vcdl.dispatch")


class EpochExecutor:
    """Drives one epoch to its barrier, doing what its :class:`EpochState` decides."""

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
        policy = EpochPolicy.of(cfg, epoch, final, pins_base=rule_of(cfg).pins_base)
        self.state = EpochState(policy)
        # The task in flight of each subtask, by (key, submission number).
        self.tasks: dict[PrefectFuture[dict[str, Any]], tuple[Key, int]] = {}
        self.futures: dict[tuple[Key, int], PrefectFuture[dict[str, Any]]] = {}
        self.done: queue.SimpleQueue[PrefectFuture[dict[str, Any]]] = queue.SimpleQueue()
        self.clock = DispatchClock()  # sent, arrived, workers free: dispatch phases
        # Dispatch phases of results not merged yet, by attempt id.
        self.overhead: dict[str, dict[str, float]] = {}
        self.duplicates = 0  # recorded when the epoch settles
        self.unrecorded = 0  # decisions the ledger refused to record (said once)
        # The background evaluation (Evaluate(background=True)), its thread, and
        # the last epoch's evaluation at the barrier.
        self.pool: ThreadPoolExecutor | None = None
        self.evaluation: Future[dict[str, Any]] | None = None
        self.final_evaluation: dict[str, Any] | None = None
        self.barrier_head: int | None = None
        # Set when run by vcdl/driver/epoch_loop.py: wait for the previous
        # epoch's barrier before acting, say when only the last results are left.
        self.gate = current_gate()
        # To ask the scheduler when a killed attempt's worker died (for its bill).
        self.dask_client = run_dask_client()
        # The workers the throughput plan pinned the shards to (ensure_subtasks).
        self.pins = ShardPins(self.dask_client)
        # When a result last came back, and the stall reports since (flows/epoch_stall.py).
        self.stall = StallWatch()

    # -- facts the state machine needs ------------------------------------------------

    def attempts_of(self, key: Key) -> tuple[AttemptFact, ...]:
        """The subtask's attempts, as the ledger has them now."""
        rows = self.ledger.attempts(self.ref.run, key[0])
        return tuple(fact(a) for a in rows if a.shard == key[1])

    def _todo(self) -> list[Key]:
        """This epoch's open subtasks, plus those of earlier epochs.

        Every open subtask of an earlier epoch was deferred (an epoch passes
        its barrier only so), maybe claimed again since.
        """
        return [
            (s.epoch, s.shard)
            for s in self.ledger.subtasks(self.ref.run, exclude_states=TERMINAL_SUBTASK_STATES)
            if s.epoch <= self.epoch
        ]

    def _opened(self) -> Opened:
        run = self.ref.run
        # Filtered in the ledger: these run at every barrier, on every attempt
        # of the run otherwise (0.3 s per scan at 10 000 attempts on SQLite).
        stranded = [
            fact(a) for a in self.ledger.attempts(run, states=("running",)) if a.epoch <= self.epoch
        ]
        leftovers = [fact(a) for a in self.ledger.attempts(run, states=MERGEABLE_ATTEMPT_STATES)]
        merged = sum(1 for s in self.ledger.subtasks(run, self.epoch) if s.state == "merged")
        versions = [v.number for v in self.ledger.versions(run) if v.epoch == self.epoch]
        return Opened(
            tuple(self._todo()),
            tuple(stranded),
            tuple(leftovers),
            merged,
            head=self.ledger.get_run(run).head_version,
            first_merged=min(versions) if versions else None,
            unevaluated=self._unevaluated_previous(),
        )

    def _returned(self, fut: PrefectFuture[dict[str, Any]], key: Key) -> Event:
        """The event a finished shard task makes (:func:`flows.epoch_returns.task_event`)."""
        event, out = task_event(fut, key, partial(self.attempts_of, key), self.log)
        if out is not None and isinstance(event, TaskReturned) and event.attempt_id:
            self.overhead[event.attempt_id] = self.clock.phases(key, out)
        return event

    def _late(self) -> list[DeadlinePassed]:
        """Subtasks in flight whose running attempts passed their deadline."""
        now = datetime.now(UTC)
        late: dict[Key, list[AttemptFact]] = {}
        for a in self.ledger.attempts(self.ref.run, states=("running",)):
            key = (a.epoch, a.shard)
            if key in self.state.in_flight and a.deadline and a.deadline < now:
                late.setdefault(key, []).append(fact(a))
        return [DeadlinePassed(k, tuple(v), self.attempts_of(k)) for k, v in late.items()]

    # -- carrying out instructions ----------------------------------------------------

    def feed(self, event: Event, *, gathered: bool = True) -> None:
        """Hand ``event`` to the state machine and carry out what it decides, in order.

        The events the instructions make (a merge's outcome) go back to the state
        machine in turn. ``gathered``: no more results are being handed over, so
        merges that wait to be folded (``merge.fold``) may go once this is done.
        """
        todo: deque[Instruction] = deque(self._handle(event))
        while True:
            while todo:
                for follow in self._do(todo.popleft()):
                    todo.extend(self._handle(follow))
            if not (gathered and self.state.waiting):
                break
            todo.extend(self._handle(Gathered()))
        if observe.listened():
            self._tell_progress()

    def _handle(self, event: Event) -> list[Instruction]:
        note_event(self.ref.run, event)  # the metrics the ledger does not keep (notices)
        return self.state.handle(event)

    def _tell_progress(self) -> None:
        """The epoch's shards finished and its tally, for in-process listeners (the CLI)."""
        others = sum(
            1 for k, s in self.state.closed.items() if k[0] == self.epoch and s != "merged"
        )
        observe.tell(
            observe.EpochProgress(
                self.epoch, self.cfg.data.shards, self.state.merged + others, self.state.counts()
            )
        )

    def _do(self, instruction: Instruction) -> list[Event]:
        """Carry out one instruction; the events it makes (merge outcomes)."""
        match instruction:
            case Submit(key, number, base):
                self.submit(key, number, base)
            case Merge(key, attempt_id):
                outcome = merge_attempt(self.ref, attempt_id, self.cfg, self.cache)
                return [self._merged(key, attempt_id, outcome)]
            case MergeGroup(items):
                outcomes = merge_attempts(self.ref, [a for _, a in items], self.cfg, self.cache)
                return [
                    self._merged(key, attempt_id, outcome)
                    for (key, attempt_id), outcome in zip(items, outcomes, strict=True)
                ]
            case Abandon(attempts, state, reason):
                for a in attempts:
                    self._abandon(a, state, reason)
            case AbandonRunning(key, reason):
                for a in self.attempts_of(key):
                    if a.state == "running":
                        self._abandon(a, "killed", reason)
            case Reject(attempt_id, reason):
                self.ledger.finish_attempt(attempt_id, state="rejected", reason=reason)
            case Close(key, state, reason):
                sub = next(
                    s for s in self.ledger.subtasks(self.ref.run, key[0]) if s.shard == key[1]
                )
                assert sub.id is not None
                self.ledger.set_subtask_state(sub.id, state, reason=reason)
                # The row keeps no time, and a deferred state is overwritten later.
                self._record(key, "closed", f"{state}: {reason}")
            case Note(key, kind, detail, worker):
                self._record(key, kind, detail, worker)
            case Cancel(key, number, message):
                self.forget(key, number, "cancelled", message)
            case MarkCrashed(key, number, message):
                self.forget(key, number, "crashed", message)
            case Say(level, message):
                self.log.log(level, message)
            case Prune(hold):
                prune_versions(self.ref, self.cfg, hold, self.log)
            case Evaluate(epoch, version, device, background):
                self._start_evaluation(epoch, version, device, background)
            case AwaitEvaluation():
                assert self.evaluation is not None
                self.evaluation.result()  # raises what the evaluation raised
            case Settle():
                self.duplicates += settle_results(self.ref, self.ledger)
            case FailEpoch(epoch):
                self._fail(epoch)
            case Advance(epoch):
                self.barrier_head = self.ledger.get_run(self.ref.run).head_version
                self.ledger.update_run(self.ref.run, epochs_completed=epoch + 1)
                if self.gate is not None:
                    self.gate.passed.set()  # the barrier: the next epoch may act
        return []

    def ensure_subtasks(self) -> None:
        """Create the epoch's subtasks, with its throughput plan (flows/epoch_pins.py)."""
        self.pins.ensure_subtasks(self.ref, self.cfg, self.ledger, self.epoch, self.log)

    def submit(self, key: Key, number: int, base: int | None) -> None:
        """Submit the subtask's shard task (its ``number``-th), from version ``base``
        (None: the head at its claim)."""
        self.clock.sent(key)
        epoch, shard = key
        dispatch_log.debug(
            "submit epoch %d shard %d attempt %d",
            epoch,
            shard,
            number,
            extra={"vcdl_run": self.ref.run, "vcdl_epoch": epoch, "vcdl_shard": shard},
        )
        # Dask resources (e.g. GPU=1) ride on the task as an annotation. No
        # Prefect tags: a tagged task run asks the API for tag concurrency slots
        # before it starts, one more round trip per attempt that stalled the
        # first attempt of an epoch by seconds (benchmarks/time_to_accuracy.py).
        resources = dict(self.cfg.cluster.task_resources)
        annotations: dict[str, Any] = {"resources": resources} if resources else {}
        if self.cfg.cluster.overlap_epochs:
            # Two epochs' tasks may wait for workers at once: the earlier epoch's first
            # (its barrier is what the later one's results wait for).
            annotations["priority"] = -epoch
        pinned = self.pins.address(shard)
        if pinned is not None:
            # The throughput plan's worker, sized for it; when it goes
            # (preempted, left) another worker takes the shard, not nobody.
            annotations.update(workers=[pinned], allow_other_workers=True)
        with dask.annotate(**annotations) if annotations else contextlib.nullcontext():
            fut = train_shard.with_options(
                task_run_name=f"epoch {epoch} · shard {shard} · attempt {number}",
            ).submit(self.ref, self.cfg, epoch, shard, base)
        self.tasks[fut] = (key, number)
        self.futures[(key, number)] = fut
        # One completion callback per future, for the epoch's life: a fresh
        # as_completed() per wait registered one more on every pending future
        # (quadratic in shards) and its closures kept finished futures alive.
        fut.add_done_callback(functools.partial(self._arrived, key))

    def _arrived(self, key: Key, fut: PrefectFuture[dict[str, Any]]) -> None:
        """A shard task's done-callback (the client's thread): note when, hand it over."""
        self.clock.arrived(key)
        self.done.put(fut)

    def forget(self, key: Key, number: int, kind: str, message: str) -> None:
        """Stop following the subtask's ``number``-th task; say so in its Prefect run."""
        fut = self.futures.pop((key, number), None)
        if fut is None:
            return
        self.tasks.pop(fut, None)
        if kind == "cancelled":
            cancel(fut)
            set_task_run_state(fut, "cancelled", message)
        else:
            set_task_run_state(fut, "crashed", message)

    def _record(self, key: Key, kind: str, detail: str, worker: str = "") -> None:
        """Record a decision the attempt rows cannot show (``vcdl story`` tells it).

        One small insert, on the fault path only. A failure to record one costs
        the story a line, never the run: said once per epoch, then ignored. A
        lost lease is no such failure (another driver runs the run now).
        """
        try:
            self.ledger.record_decision(self.ref.run, *key, kind, detail, worker=worker or None)
        except LeaseLost:
            raise
        except Exception as exc:
            if not self.unrecorded:
                self.log.warning(
                    "epoch %d shard %d: its %s decision was not recorded in the ledger (vcdl "
                    "story will not tell it; the run goes on): %s",
                    *key,
                    kind,
                    exc,
                )
            self.unrecorded += 1

    def _abandon(self, a: AttemptFact, state: str, reason: str) -> None:
        # A killed attempt ended when its worker died, not when the driver
        # found out (often after the re-run): bill it that long.
        ended = (
            worker_left_at(a.worker, a.started_at, self.dask_client)
            if state == "killed" and a.started_at is not None
            else None
        )
        if self.ledger.abandon_attempt(a.id, state=state, reason=reason, ended_at=ended):
            note_kill(self.ref.run, state)

    def _merged(self, key: Key, attempt_id: str, outcome: MergeOutcome) -> MergeDone:
        """Record a merge's outcome (timings, progress) as the state machine's event."""
        overhead = self.overhead.pop(attempt_id, {})
        if outcome.kind in ("merged", "rejected"):
            phases = {f"assimilator_{k}": v for k, v in outcome.timings.items()}
            self.ledger.add_timings(attempt_id, phases | overhead)
        if outcome.kind == "merged":
            self.progress()
            if outcome.version is not None:
                observe.tell(observe.Merged(key[0], key[1], outcome.version))
        lost = outcome.kind in ("rejected", "skipped")
        return MergeDone(
            key,
            attempt_id,
            outcome.kind,
            reason=outcome.reason,
            version=outcome.version,
            alpha=outcome.alpha,
            staleness=outcome.staleness,
            attempts=self.attempts_of(key) if lost else (),
        )

    # -- the epoch ------------------------------------------------------------------

    def drain(self) -> None:
        """Wait for results until the state machine says the epoch is at its barrier."""
        checked = time.monotonic()
        self.stall.result_came(checked)
        while not self.state.finished:
            try:
                fut: PrefectFuture[dict[str, Any]] | None = self.done.get(timeout=POLL_SECONDS)
            except queue.Empty:
                fut = None
            if time.monotonic() - checked >= POLL_SECONDS:
                # A driver paused past its lease finds out here even while it
                # has nothing to write (its writes are refused anyway).
                self.ledger.check_lease(self.ref.run)
                # Also while results keep coming: one hung attempt among many.
                for late in self._late():
                    self.feed(late)
                checked = time.monotonic()
                check_stall(self, checked)
            if fut is not None:
                self.stall.result_came(time.monotonic())
                # The results already in are handed over first, so that merges
                # waiting to be folded (merge.fold) go together.
                self._take(fut)
                while self.state.gathering:
                    try:
                        self._take(self.done.get_nowait())
                    except queue.Empty:
                        break
                self.feed(Gathered())
            self.feed(Tick(time.monotonic()))
            self._tell_gate()

    def _take(self, fut: PrefectFuture[dict[str, Any]]) -> None:
        """Hand the state machine what a finished shard task made (if it is still followed)."""
        task = self.tasks.pop(fut, None)
        if task is None:
            return
        key, number = task
        self.feed(self._returned(fut, key), gathered=False)
        self.futures.pop((key, number), None)
        release(fut)

    def _tell_gate(self) -> None:
        """Tell the gate of vcdl/driver/epoch_loop.py where this epoch is.

        Raises RunStopping if the run is stopping (interrupted: a resume does
        the rest); lets the next epoch's subflow set up once this one waits
        only for its last results.
        """
        if self.gate is None:
            return
        self.gate.check()
        if self.state.in_tail:
            self.gate.tail()

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

    def _start_evaluation(
        self, epoch: int, version: int | None, device: str, background: bool
    ) -> None:
        if not background:
            self.final_evaluation = self._evaluate(epoch, version, device)
            return
        assert self.pool is not None and version is not None
        # In a copy of this context: Prefect's flow run context.
        self.evaluation = self.pool.submit(
            contextvars.copy_context().run, partial(self._evaluate, epoch, version, device)
        )

    def _evaluate(self, epoch: int, version: int | None, device: str) -> dict[str, Any]:
        # In the driver: workers are busy training (previous epoch) or done (final).
        if version is None:
            version = self.ledger.get_run(self.ref.run).head_version
        cfg = (
            self.cfg.updated(train={"device": device})
            if device != self.cfg.train.device
            else self.cfg
        )
        ev = evaluate_head(self.ref, cfg, version, epoch)
        publish_epoch_table(self.ref, epoch)
        headline = objective_for(self.cfg.train).headline
        observe.tell(observe.Evaluated(epoch, version, dict(ev["metrics"]), headline))
        self.log.info(
            "epoch %d: head v%d, test %s", epoch, version, format_metrics(ev["metrics"], headline)
        )
        return ev

    def _fail(self, epoch: int) -> None:
        subs = self.ledger.subtasks(self.ref.run, epoch)
        reasons = sorted({s.reason or "" for s in subs if s.state == "failed"})
        raise EpochFailed(
            f"epoch {epoch} of run {self.ref.run}: no shard could be merged "
            f"({'; '.join(reasons)[:500]}); fix the cause and `vcdl resume {self.ref.run}`"
        )

    def _start_early(self) -> bool:
        """Under ``cluster.overlap_epochs``, submit a fresh epoch's shards now, in the
        previous epoch's tail (:class:`StartEarly`); whether it did. An epoch whose
        subtasks exist (a driver left it) waits for the barrier as always."""
        if not self.cfg.cluster.overlap_epochs or self.state.policy.pins_base:
            return False
        if self.ledger.subtasks(self.ref.run, self.epoch):
            return False
        self.ensure_subtasks()
        self.log.info(
            "epoch %d: its shards start in epoch %d's tail (cluster.overlap_epochs); "
            "their results merge after its barrier",
            self.epoch,
            self.epoch - 1,
        )
        self.feed(StartEarly(tuple((self.epoch, s) for s in range(self.cfg.data.shards))))
        return True

    def run(self) -> dict[str, Any]:
        early = False
        if self.gate is not None:
            # Nothing before the previous epoch's barrier (vcdl/driver/epoch_loop.py),
            # except submitting a fresh epoch's shards under cluster.overlap_epochs.
            if self.gate.must_wait():
                early = self._start_early()
                if not early:
                    self.log.info("set up; waiting for epoch %d's last results", self.epoch - 1)
            try:
                self.gate.wait_previous()
            except RunStopping:
                for fut in list(self.tasks):  # started early: nobody will merge them
                    cancel(fut)
                raise
        if not early:
            self.ensure_subtasks()
        # The thread of the previous barrier's evaluation (Evaluate, background).
        with ThreadPoolExecutor(1, thread_name_prefix="vcdl-evaluate") as self.pool:
            self.feed(self._opened())
            self._tell_gate()  # few shards left (resumed, deferred): maybe in the tail already
            started = time.perf_counter()
            self.drain()
            self.feed(AtBarrier())
        head = self.barrier_head
        assert head is not None  # Advance read it
        self.progress(force=True)
        seconds = time.perf_counter() - started
        observe.tell(observe.EpochPassed(self.epoch, head, seconds))
        self.log.info("epoch %d done in %.1fs: head v%d", self.epoch, seconds, head)
        tally = self.state.counts()
        tally["duplicate"] += self.duplicates
        ev = self.final_evaluation
        return {
            "epoch": self.epoch,
            "head_version": head,
            **tally,
            "test_accuracy": ev["accuracy"] if ev else None,
            "test_metrics": ev["metrics"] if ev else None,
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
    updated as shards are merged. Run by vcdl/driver/epoch_loop.py, it
    ends Cancelled when the run stops before or while it runs (an earlier
    epoch failed, the train flow was interrupted): a resume does the rest.
    """
    try:
        return EpochExecutor(ref, config, epoch, final, progress_id).run()
    except RunStopping as exc:
        return Cancelled(message=str(exc))
