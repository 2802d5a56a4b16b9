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
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from vcdl.driver.epoch_events import (
    Abandon,
    AbandonRunning,
    AttemptFact,
    Cancel,
    Close,
    DeadlinePassed,
    DropCheckpoint,
    EpochPolicy,
    Event,
    Instruction,
    Key,
    MarkCrashed,
    Merge,
    MergeDone,
    Opened,
    RecordDuplicate,
    Reject,
    Say,
    Submit,
    TaskLost,
    TaskReturned,
    Tick,
)
from vcdl.states import MERGEABLE_ATTEMPT_STATES, TERMINAL_SUBTASK_STATES

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


# -- the budget ---------------------------------------------------------------------


def free_attempts(attempts: Iterable[AttemptFact]) -> int:
    """Killed attempts of one subtask that checkpointed further than any before them.

    ``samples`` of an attempt that was killed is its last checkpoint's (the
    ledger updates it with each checkpoint, counting the samples it resumed
    from), or None when it never checkpointed. A subtask whose attempts keep
    dying at the same point (out of memory at one batch) stops moving forward,
    and those deaths count; progress is bounded by the shard's samples, so
    free attempts are too.
    """
    frontier, free = 0, 0
    for a in sorted(attempts, key=lambda a: a.number):
        reached = a.samples or 0
        if a.state == "killed" and reached > frontier:
            free += 1
        frontier = max(frontier, reached)
    return free


def _marked(
    attempts: Sequence[AttemptFact], ids: Iterable[str], state: str
) -> tuple[AttemptFact, ...]:
    """``attempts`` with those of ``ids`` in ``state``: the ledger once our marks land."""
    chosen = set(ids)
    return tuple(replace(a, state=state) if a.id in chosen else a for a in attempts)


def _running(attempts: Iterable[AttemptFact], but: str | None = None) -> tuple[AttemptFact, ...]:
    return tuple(a for a in attempts if a.state == "running" and a.id != but)


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
    tally: Counter[str] = field(default_factory=Counter)

    @property
    def finished(self) -> bool:
        """True once opened and nothing is in flight or being merged: the barrier."""
        return self.opened and not self.in_flight and not self.merging

    def counts(self) -> dict[str, int]:
        """The tally of what happened, every key present."""
        return {k: self.tally[k] for k in TALLY_KEYS}

    def handle(self, event: Event) -> list[Instruction]:
        """What to do about ``event``, in order."""
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
        return [Submit(key, self.submitted[key])]

    def _opened(self, event: Opened) -> list[Instruction]:
        if self.opened:
            raise RuntimeError(f"epoch {self.policy.epoch} opened twice")
        self.opened, self.merged = True, event.merged
        out: list[Instruction] = []
        if event.stranded:
            out.append(
                Abandon(event.stranded, "killed", "lost with a previous driver or its cluster")
            )
            self.tally["killed"] += len(event.stranded)
        todo = list(dict.fromkeys(event.todo))
        for a in sorted(event.leftovers, key=lambda a: (a.key, a.number)):
            if a.key in todo and a.key not in self.merging and a.state in MERGEABLE_ATTEMPT_STATES:
                out.append(self._say(logging.INFO, a.key, "left by a previous driver: merging it"))
                out.append(Merge(a.key, a.id))
                self.merging[a.key] = True
        for key in todo:
            if key not in self.merging:
                out += self._submit(key)
        return out

    def _returned(self, event: TaskReturned) -> list[Instruction]:
        key = event.key
        if event.kind == "handed_back":
            self.handed_back[key] += 1
            reason = f"handed back untrained by {event.worker}, under preemption notice"
            return self._lost(key, reason, event.attempts)
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
            attempts = _marked(event.attempts, [event.attempt_id], "rejected")
            return [
                Reject(event.attempt_id, reason),
                *self._reissue(key, "preempted with notice; partial result discarded", attempts),
            ]
        out: list[Instruction] = []
        # Attempts of this subtask that Dask re-ran elsewhere left "running" rows.
        rerun = _running(event.attempts, but=event.attempt_id)
        if rerun:
            out.append(Abandon(rerun, "killed", "worker died; the task was re-run elsewhere"))
            self.tally["killed"] += len(rerun)
        self.merging[key] = False
        return [*out, Merge(key, event.attempt_id)]

    def _lost(self, key: Key, reason: str, attempts: Sequence[AttemptFact]) -> list[Instruction]:
        """The task brought no result (its worker died, or took nothing under notice)."""
        self.tally["errors"] += 1
        out: list[Instruction] = []
        dead = _running(attempts)
        if dead:
            out.append(Abandon(dead, "killed", "worker died"))
            self.tally["killed"] += len(dead)
        return out + self._reissue(key, reason, _marked(attempts, (a.id for a in dead), "killed"))

    def _deadline(self, event: DeadlinePassed) -> list[Instruction]:
        key = event.key
        self.tally["timeouts"] += 1
        attempts = _marked(event.attempts, (a.id for a in event.late), "timeout")
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
        if event.kind in ("merged", "duplicate"):
            # Merged, by this attempt or (duplicate) by another one: done.
            self.closed[key] = "merged"
            if key[0] == self.policy.epoch:
                self.merged += 1
            if event.kind == "duplicate":
                return []
            return [
                self._say(
                    logging.INFO,
                    key,
                    f"merged as v{event.version} (alpha {event.alpha or 0.0:.3f}, "
                    f"staleness {event.staleness})",
                )
            ]
        why = f"{event.kind}: {event.reason}" if event.reason else event.kind
        out: list[Instruction] = []
        if event.kind == "rejected":
            out.append(self._say(logging.WARNING, key, f"rejected: {event.reason}"))
        if leftover:
            # A result a previous driver left: its subtask is trained now, as
            # if the result had never been (the attempt budget counts it).
            return out + self._submit(key)
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
        return [self._say(logging.WARNING, key, f"reissued: {reason}"), *self._submit(key)]

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


# -- after the barrier --------------------------------------------------------------


class _SettleAttempt(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def subtask_id(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def result_uri(self) -> str | None: ...
    @property
    def checkpoint_uri(self) -> str | None: ...


class _SettleSubtask(Protocol):
    @property
    def id(self) -> int | None: ...
    @property
    def state(self) -> str: ...


def settle(
    attempts: Iterable[_SettleAttempt], subtasks: Iterable[_SettleSubtask]
) -> list[RecordDuplicate | DropCheckpoint]:
    """What to tidy once an epoch passed its barrier.

    ``attempts``: those that may need it (mergeable, or with a checkpoint);
    ``subtasks``: those of their epochs. Results that arrived for subtasks
    merged from another attempt are duplicates; checkpoints of attempts of
    finished subtasks (killed ones nobody resumed, or superseded) are
    deleted.
    """
    subs = list(subtasks)
    merged = {s.id for s in subs if s.state == "merged"}
    done = {s.id for s in subs if s.state in TERMINAL_SUBTASK_STATES}
    out: list[RecordDuplicate | DropCheckpoint] = []
    for a in attempts:
        if a.checkpoint_uri is not None and a.subtask_id in done:
            out.append(DropCheckpoint(a.id))
        if a.state in MERGEABLE_ATTEMPT_STATES and a.subtask_id in merged:
            out.append(RecordDuplicate(a.id, a.result_uri))
    return out
