"""The epoch's decisions as a pure state machine: events in, instructions out.

One epoch of a run is driven to its barrier by :class:`EpochState`. It is told
what happened (:data:`Event`: the epoch opened with the ledger's state, a
task returned a result, a task was lost, a merge finished, an attempt passed
its deadline, time passed) and answers with what to do
(:data:`Instruction`: submit a shard task, merge a result, give up on an
attempt, close a subtask as failed, dropped or deferred, cancel a task, say
something in the log). It does no I/O: it imports neither Prefect, Dask,
SQLAlchemy nor zarr. ``flows/epoch.py`` carries the instructions out and
feeds their results back as events, in the manner of dask.distributed's
``worker_state_machine.py``.

The rules it owns (docs/design.md §1.3-§1.4):

* **Every subtask is merged at most once.** A result is merged only for a
  subtask with a task in flight; once merged, the subtask is done.
* **None is lost.** A task that died, timed out, was handed back untrained,
  or whose result was rejected is reissued, until its subtask's budget is
  spent (then it is *failed*, with the reason); at the quorum deadline the
  stragglers are *deferred* to the next epoch or *dropped* (``fault.late``).
* **The attempt budget** (``fault.max_attempts``) stops a subtask that
  cannot succeed without failing healthy ones on a spot fleet: a killed
  attempt that checkpointed further than any before it is free (its
  replacement resumes there), and so is a task a worker under preemption
  notice handed back untrained, up to :data:`FREE_HANDBACKS` per subtask.
  Tasks are counted as well as attempts: a task that fails before it can
  claim an attempt (a broken worker environment) must not be reissued
  forever.
* **Recovery.** An epoch opened by a new driver gives up on the attempts a
  dead driver left running and merges the results it left unmerged: a
  finished subtask is never trained again.

The events carry the facts the rules need (a subtask's attempts as the
ledger lists them when the event happens); the state keeps only what the
ledger cannot tell (tasks submitted, hand-backs, the quorum clock).

It also decides what the executor used to: which results wait to be merged
together (``merge.fold``: :class:`MergeGroup`, on :class:`Gathered`, never
across an epoch's end), how often retention runs (:class:`Prune`, once per
``prune_every`` merges and at the barrier, holding a version being
evaluated), which base an epoch pins (``pins_base``: every
:class:`Submit` of the epoch names it), when the previous epoch's head is
evaluated (in the background as the epoch opens) and the last one's (at its
barrier), and what the barrier does (:class:`AtBarrier`: the epoch fails
when none of its subtasks merged, else settle, evaluate, prune, advance).

Like dask's worker state machine it keeps a bounded log of the events it
received and the instructions it returned (:meth:`EpochState.story`, for one
subtask, while its driver runs), and checks its own invariants
(:meth:`EpochState.validate_state`). What of that log no ledger row shows it
says in :class:`Note` instructions (a task handed back untrained under
notice, with its worker; a reissue, with its reason), which the executor
records in the ledger with each :class:`Close` (``decision`` rows): ``vcdl
story`` tells them after the driver is gone.

One epoch's decisions are here, every rule beside the others it interacts
with (the budget, reissues, the quorum, merges and the barrier); the
vocabulary lives in :mod:`vcdl.driver.epoch_events`, and what is read off a
subtask's attempts without state (the budget's free attempts, what to tidy
after the barrier: :func:`~vcdl.driver.epoch_attempts.settle`) in
:mod:`vcdl.driver.epoch_attempts`.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from vcdl.driver.epoch_attempts import as_marked, free_attempts, still_running
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
    TaskLost,
    TaskReturned,
    Tick,
)
from vcdl.states import MERGEABLE_ATTEMPT_STATES

TALLY_KEYS = (
    "merged",
    "duplicate",
    "rejected",
    "skipped",
    "errors",
    "reissued",
    "timeouts",
    "killed",
    "dropped",
    "deferred",
    "failed",
)


STORY_LENGTH = 10_000
"""Events the state keeps in its log (each with what it decided): a long epoch's."""


def _mentions(item: object, key: Key) -> bool:
    """Whether an event or instruction concerns subtask ``key``."""
    if getattr(item, "key", None) == key:
        return True
    if isinstance(item, MergeGroup):
        return any(k == key for k, _ in item.items)
    if isinstance(item, StartEarly):
        return key in item.todo
    if isinstance(item, Abandon | Opened):
        facts = item.attempts if isinstance(item, Abandon) else (*item.stranded, *item.leftovers)
        return any(a.key == key for a in facts) or (isinstance(item, Opened) and key in item.todo)
    return False


# -- the machine --------------------------------------------------------------------


@dataclass
class EpochState:
    """One epoch's decisions; see the module docstring. Feed it events with :meth:`handle`."""

    policy: EpochPolicy
    in_flight: set[Key] = field(default_factory=set)
    """Subtasks with a shard task in flight."""
    merging: dict[Key, bool] = field(default_factory=dict)
    """Subtasks with a :class:`Merge` not yet answered -> whether the result was a leftover."""
    closed: dict[Key, str] = field(default_factory=dict)
    """Subtasks finished in this epoch's view: merged, failed, dropped or deferred."""
    submitted: Counter[Key] = field(default_factory=Counter)
    handed_back: Counter[Key] = field(default_factory=Counter)
    merged: int = 0
    """This epoch's subtasks merged (before it opened, and since)."""
    quorum_at: float | None = None
    opened: bool = False
    early: bool = False
    """Its shards were submitted in the previous epoch's tail (:class:`StartEarly`)."""
    tally: Counter[str] = field(default_factory=Counter)
    waiting: list[tuple[Key, str]] = field(default_factory=list)
    """Merges decided and not issued yet (``fold`` > 1): they go on :class:`Gathered`."""
    since_prune: int = 0
    """Merges since retention last ran."""
    base: int | None = None
    """The version every shard of this epoch trains from (``pins_base``), else None."""
    evaluating: frozenset[int] = frozenset()
    """The version evaluated in the background: retention keeps it meanwhile."""
    barrier: bool = False
    """Set once :class:`AtBarrier` was handled."""
    log: deque[tuple[Event, tuple[Instruction, ...]]] = field(
        default_factory=lambda: deque(maxlen=STORY_LENGTH)
    )
    """The last :data:`STORY_LENGTH` events and what each one decided (:meth:`story`)."""

    @property
    def finished(self) -> bool:
        """True once opened and nothing is in flight or being merged: the barrier."""
        return self.opened and not self.in_flight and not self.merging

    @property
    def in_tail(self) -> bool:
        """Only the last results are outstanding (no more in flight than workers)."""
        return len(self.in_flight) <= self.policy.workers

    @property
    def gathering(self) -> bool:
        """Merges wait to be folded and a fold is not full: hand in more results first."""
        return bool(self.waiting) and len(self.waiting) < self.policy.fold

    def counts(self) -> dict[str, int]:
        """The tally of what happened, every key present."""
        return {k: self.tally[k] for k in TALLY_KEYS}

    def handle(self, event: Event) -> list[Instruction]:
        """What to do about ``event``, in order (recorded in :attr:`log`)."""
        out = self._handle(event)
        self.log.append((event, tuple(out)))
        return out

    def story(self, key: Key) -> list[tuple[Event, tuple[Instruction, ...]]]:
        """The logged events that concern subtask ``key``, each with what it decided."""
        return [
            (event, out)
            for event, out in self.log
            if _mentions(event, key) or any(_mentions(i, key) for i in out)
        ]

    def validate_state(self) -> None:
        """Raise AssertionError if the state breaks one of its invariants."""
        closed, flying, merging = set(self.closed), self.in_flight, set(self.merging)
        assert not flying & closed, f"in flight and closed: {sorted(flying & closed)}"
        assert not flying & merging, f"in flight and merging: {sorted(flying & merging)}"
        assert not merging & closed, f"merging and closed: {sorted(merging & closed)}"
        assert all(self.submitted[k] >= 1 for k in flying), "in flight, never submitted"
        waiting = [k for k, _ in self.waiting]
        assert len(waiting) == len(set(waiting)), f"merged twice: {waiting}"
        assert set(waiting) <= merging, "a waiting merge for a subtask not being merged"
        assert self.policy.fold > 1 or not self.waiting, "merges wait only to be folded"
        assert 0 <= self.merged <= self.policy.shards, f"{self.merged} of this epoch merged"
        assert 0 <= self.since_prune < self.policy.prune_every or not self.policy.retention
        assert self.opened or not (merging or closed), "acting before it opened"
        assert self.opened or self.early or not flying, "submitting before it opened"
        assert not self.barrier or self.finished, "past the barrier with work left"
        assert self.base is None or self.policy.pins_base, (
            "a pinned base for a rule that reads none"
        )

    def _handle(self, event: Event) -> list[Instruction]:
        if isinstance(event, Gathered):
            return self._gathered()
        if isinstance(event, AtBarrier):
            return self._at_barrier()
        if isinstance(event, StartEarly):
            return self._start_early(event)
        if isinstance(event, Opened):
            return self._opened(event)
        if isinstance(event, Tick):
            return self._tick(event.now)
        if isinstance(event, MergeDone):
            return self._merge_done(event)
        if event.key not in self.in_flight:
            return []  # a task already given up on (cancelled): its news changes nothing
        self.in_flight.discard(event.key)
        if isinstance(event, TaskReturned):
            return self._returned(event)
        if isinstance(event, TaskLost):
            number = self.submitted[event.key]
            crashed = [MarkCrashed(event.key, number, event.crashed)] if event.crashed else []
            return [*crashed, *self._lost(event.key, event.reason, event.attempts)]
        return self._deadline(event)

    # -- the rules ----------------------------------------------------------------

    def _say(self, level: int, key: Key, text: str) -> Say:
        return Say(level, f"epoch {key[0]} shard {key[1]} {text}")

    def _submit(self, key: Key) -> list[Instruction]:
        self.submitted[key] += 1
        self.in_flight.add(key)
        # A deferred shard of an earlier epoch trains from the head, pinned or not.
        base = self.base if key[0] == self.policy.epoch else None
        return [Submit(key, self.submitted[key], base)]

    def _merge(self, key: Key, attempt_id: str) -> list[Instruction]:
        """Merge now, or (``fold`` > 1) wait for :class:`Gathered` to merge with others."""
        if self.policy.fold <= 1:
            return [Merge(key, attempt_id)]
        self.waiting.append((key, attempt_id))
        return []

    def _gathered(self) -> list[Instruction]:
        """The waiting merges, up to ``fold`` of one epoch at a time, in order."""
        out: list[Instruction] = []
        while self.waiting:
            epoch, n = self.waiting[0][0][0], 1
            while (
                n < min(len(self.waiting), self.policy.fold)
                and self.waiting[n][0][0] == epoch  # never across an epoch's end
            ):
                n += 1
            out.append(MergeGroup(tuple(self.waiting[:n])))
            self.waiting = self.waiting[n:]
        return out

    def _at_barrier(self) -> list[Instruction]:
        """What the barrier does: fail the epoch if nothing of it merged, else tidy,
        evaluate the last epoch, prune, and let the next epoch act."""
        if not self.finished or self.barrier:
            raise RuntimeError(f"epoch {self.policy.epoch} is not at its barrier")
        self.barrier = True
        p = self.policy
        out: list[Instruction] = [AwaitEvaluation()] if self.evaluating else []
        self.evaluating = frozenset()
        if self.merged == 0:
            return [*out, FailEpoch(p.epoch)]
        out.append(Settle())
        if p.final:
            # No next epoch to overlap with: evaluated now, before the run counts it
            # done (a resumed driver evaluates it again).
            out.append(Evaluate(p.epoch, None, p.eval_device))
        # After the evaluation: the best version may have changed with it.
        out += self._prune()
        return [*out, Advance(p.epoch)]

    def _prune(self) -> list[Instruction]:
        self.since_prune = 0
        return [Prune(self.evaluating)] if self.policy.retention else []

    def _start_early(self, event: StartEarly) -> list[Instruction]:
        if self.opened or self.early:
            raise RuntimeError(f"epoch {self.policy.epoch} started early after it started")
        if self.policy.pins_base:
            raise RuntimeError("a rule that pins the epoch's base cannot start before the barrier")
        self.early = True
        out: list[Instruction] = []
        for key in dict.fromkeys(event.todo):
            out += self._submit(key)
        return out

    def _opened(self, event: Opened) -> list[Instruction]:
        if self.opened:
            raise RuntimeError(f"epoch {self.policy.epoch} opened twice")
        self.opened, self.merged = True, event.merged
        p = self.policy
        if p.pins_base:
            # Resumed part-way: the base its first merge started from.
            self.base = event.first_merged - 1 if event.first_merged is not None else event.head
        out: list[Instruction] = []
        if event.unevaluated is not None:
            # The previous barrier's evaluation overlaps this epoch's first attempts
            # and merges (a result merged late is a staler base for the next one).
            epoch, version = event.unevaluated
            out.append(Evaluate(epoch, version, p.eval_device, background=True))
            self.evaluating = frozenset({version})
        # Subtasks in flight already were started early (StartEarly): their running
        # attempts and results are this driver's, followed by their tasks.
        stranded = tuple(a for a in event.stranded if a.key not in self.in_flight)
        if stranded:
            out.append(Abandon(stranded, "killed", "lost with a previous driver or its cluster"))
            self.tally["killed"] += len(stranded)
        todo = [k for k in dict.fromkeys(event.todo) if k not in self.in_flight]
        for a in sorted(event.leftovers, key=lambda a: (a.key, a.number)):
            if a.key in todo and a.key not in self.merging and a.state in MERGEABLE_ATTEMPT_STATES:
                out.append(self._say(logging.INFO, a.key, "left by a previous driver: merging it"))
                self.merging[a.key] = True
                out += self._merge(a.key, a.id)
        lost = {a.key for a in stranded}
        for key in todo:
            if key not in self.merging:
                if key in lost:  # a new driver's reissue: its Say is the Abandon's row
                    out.append(Note(key, "reissue", "its attempt was lost with a previous driver"))
                out += self._submit(key)
        return out

    def _returned(self, event: TaskReturned) -> list[Instruction]:
        key = event.key
        if event.kind == "handed_back":
            self.handed_back[key] += 1
            reason = f"handed back untrained by {event.worker}, under preemption notice"
            noted = Note(key, "handed_back", "untrained, under preemption notice", event.worker)
            return [noted, *self._lost(key, reason, event.attempts)]
        if event.kind == "skipped":  # the subtask was finished before the task began
            self.tally["skipped"] += 1
            return []
        assert event.attempt_id is not None, "a result names its attempt"
        if event.kind == "interrupted" and self.policy.partial == "discard":
            reason = (
                f"partial result ({event.samples}/{event.planned_samples} samples) "
                "discarded by policy fault.partial=discard"
            )
            self.tally["rejected"] += 1
            attempts = as_marked(event.attempts, [event.attempt_id], "rejected")
            return [
                Reject(event.attempt_id, reason),
                *self._reissue(key, "preempted with notice; partial result discarded", attempts),
            ]
        out: list[Instruction] = []
        # Attempts of this subtask that Dask re-ran elsewhere left "running" rows.
        rerun = still_running(event.attempts, but=event.attempt_id)
        if rerun:
            out.append(Abandon(rerun, "killed", "worker died; the task was re-run elsewhere"))
            self.tally["killed"] += len(rerun)
        self.merging[key] = False
        return [*out, *self._merge(key, event.attempt_id)]

    def _lost(self, key: Key, reason: str, attempts: Sequence[AttemptFact]) -> list[Instruction]:
        """The task brought no result (its worker died, or took nothing under notice)."""
        self.tally["errors"] += 1
        out: list[Instruction] = []
        dead = still_running(attempts)
        if dead:
            out.append(Abandon(dead, "killed", "worker died"))
            self.tally["killed"] += len(dead)
        return out + self._reissue(key, reason, as_marked(attempts, (a.id for a in dead), "killed"))

    def _deadline(self, event: DeadlinePassed) -> list[Instruction]:
        key = event.key
        self.tally["timeouts"] += 1
        attempts = as_marked(event.attempts, (a.id for a in event.late), "timeout")
        return [
            Cancel(key, self.submitted[key], "attempt past its deadline"),
            Abandon(event.late, "timeout", "past its deadline"),
            *self._reissue(key, f"timeout after {self.policy.attempt_timeout:.0f}s", attempts),
        ]

    def _merge_done(self, event: MergeDone) -> list[Instruction]:
        key = event.key
        if key not in self.merging:
            raise RuntimeError(f"merge outcome for {key} without a merge in progress")
        leftover = self.merging.pop(key)
        self.tally[event.kind] += 1
        out: list[Instruction] = []
        if event.kind in ("merged", "duplicate"):
            # Merged, by this attempt or (duplicate) by another one: done.
            self.closed[key] = "merged"
            if key[0] == self.policy.epoch:
                self.merged += 1
            if event.kind == "duplicate":
                return []
            out.append(
                self._say(
                    logging.INFO,
                    key,
                    f"merged as v{event.version} (alpha {event.alpha or 0.0:.3f}, "
                    f"staleness {event.staleness})",
                )
            )
            self.since_prune += 1
            if self.policy.retention and self.since_prune >= self.policy.prune_every:
                out += self._prune()
            return out
        why = f"{event.kind}: {event.reason}" if event.reason else event.kind
        if event.kind == "rejected":
            out.append(self._say(logging.WARNING, key, f"rejected: {event.reason}"))
        if leftover:
            # A result a previous driver left: its subtask is trained now, as
            # if the result had never been (the attempt budget counts it).
            return [
                *out,
                Note(key, "reissue", f"{why} (left by a previous driver)"),
                *self._submit(key),
            ]
        return out + self._reissue(key, why, event.attempts)

    def _reissue(self, key: Key, reason: str, attempts: Sequence[AttemptFact]) -> list[Instruction]:
        if key in self.closed:
            return []
        free = free_attempts(attempts)
        # A free attempt also frees the task it came from (one at most: Dask
        # re-runs a task on a worker's death, so one task may have several).
        untrained = min(self.handed_back[key], self.policy.free_handbacks)
        tries = max(len(attempts) - free, self.submitted[key] - untrained - free)
        if tries >= self.policy.max_attempts:
            spared = f" ({free} more moved it forward before their workers died)" if free else ""
            self.closed[key] = "failed"
            self.tally["failed"] += 1
            return [
                Close(key, "failed", f"{tries} attempts{spared}, last: {reason}"),
                self._say(logging.ERROR, key, f"failed for good: {reason}"),
            ]
        self.tally["reissued"] += 1
        return [
            self._say(logging.WARNING, key, f"reissued: {reason}"),
            Note(key, "reissue", reason),
            *self._submit(key),
        ]

    def _tick(self, now: float) -> list[Instruction]:
        """Past the straggler deadline: leave the late shards to the next epoch or drop them."""
        p = self.policy
        if p.quorum >= 1.0 or p.final or not self.opened:
            return []
        if self.quorum_at is None:
            if self.merged >= p.quorum * p.shards:
                self.quorum_at = now
            return []
        if now - self.quorum_at < p.straggler_timeout or not self.in_flight:
            return []
        out: list[Instruction] = []
        state: Literal["dropped", "deferred"] = "dropped" if p.late == "drop" else "deferred"
        for key in sorted(self.in_flight):
            out += [
                Cancel(key, self.submitted[key], f"straggler: {p.late} by quorum policy"),
                AbandonRunning(key, "cancelled as a straggler"),
                Close(key, state, "late: quorum policy"),
            ]
            self.closed[key] = state
            self.tally[state] += 1
        self.in_flight.clear()
        out.append(Say(logging.WARNING, f"epoch {p.epoch} closed at quorum: stragglers {p.late}"))
        return out
