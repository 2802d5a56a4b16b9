"""An epoch's attempts read as the ledger lists them: pure functions, no state.

This module owns what :class:`~vcdl.driver.epoch_state.EpochState`'s rules and
the executor's tidying read off a subtask's attempts (:class:`AttemptFact`, or
the ledger's rows): which killed attempts the attempt budget does not count
(:func:`free_attempts`: those that checkpointed further than any before them),
the attempts as they will read once the state's marks land
(:func:`as_marked`), those still running (:func:`still_running`), and what to
tidy once an epoch passed its barrier (:func:`settle`: results that arrived
for subtasks merged from another attempt, checkpoints nobody will resume).
Like the state machine it does no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Protocol

from vcdl.driver.epoch_events import AttemptFact, DropCheckpoint, RecordDuplicate, RecordLate
from vcdl.states import MERGEABLE_ATTEMPT_STATES, TERMINAL_SUBTASK_STATES

__all__ = ["as_marked", "free_attempts", "settle", "still_running"]

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


def as_marked(
    attempts: Sequence[AttemptFact], ids: Iterable[str], state: str
) -> tuple[AttemptFact, ...]:
    """``attempts`` with those of ``ids`` in ``state``: the ledger once our marks land."""
    chosen = set(ids)
    return tuple(replace(a, state=state) if a.id in chosen else a for a in attempts)


def still_running(
    attempts: Iterable[AttemptFact], but: str | None = None
) -> tuple[AttemptFact, ...]:
    return tuple(a for a in attempts if a.state == "running" and a.id != but)


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
) -> list[RecordDuplicate | RecordLate | DropCheckpoint]:
    """What to tidy once an epoch passed its barrier.

    ``attempts``: those that may need it (mergeable, or with a checkpoint);
    ``subtasks``: those of their epochs. Results that arrived for subtasks
    merged from another attempt are duplicates; results that arrived for
    subtasks closed without a merge (dropped, failed) are late, rejected;
    checkpoints of attempts of finished subtasks (killed ones nobody resumed,
    or superseded) are deleted.
    """
    subs = list(subtasks)
    state_of = {s.id: s.state for s in subs}
    done = {s.id for s in subs if s.state in TERMINAL_SUBTASK_STATES}
    out: list[RecordDuplicate | RecordLate | DropCheckpoint] = []
    for a in attempts:
        if a.checkpoint_uri is not None and a.subtask_id in done:
            out.append(DropCheckpoint(a.id))
        if a.state not in MERGEABLE_ATTEMPT_STATES or a.subtask_id not in done:
            continue
        closed = state_of[a.subtask_id]
        if closed == "merged":
            out.append(RecordDuplicate(a.id, a.result_uri))
        else:
            out.append(RecordLate(a.id, a.result_uri, closed))
    return out
