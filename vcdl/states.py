"""The lifecycle of runs, subtasks and attempts: their states, named subsets, allowed moves.

This module is the one place that says what state a run, a subtask (run,
epoch, shard) or an attempt (one execution of a subtask) can be in, which
groups of states the rest of vcdl asks about, and which changes of state are
legal. The ledger refuses every other change (:func:`check_subtask_move`,
:func:`check_attempt_move`, :func:`check_run_move`), naming both states.

Subtask::

    pending ──claim──▶ running ──merge──▶ merged            (final)
       │                  │ ▲
       │                  │ └─ claim again (a reissue: more attempts)
       │                  ├──budget spent──▶ failed          (final)
       └──────────────────┼──quorum: late──▶ dropped         (final)
                          └──quorum: late──▶ deferred ──claim──▶ running
                                              (done in a later epoch)

Attempt (the worker records how it ended; the driver records what became of
it)::

    running ──▶ finished | interrupted (a partial result) | failed
            ──▶ killed | timeout      (the driver gave up on it; it may still
                                       record its end if it was alive after all)
            ──▶ duplicate             (its result came in after another attempt's
                                       was merged: the ledger records it so at once)
    finished | interrupted ──▶ merged | rejected | duplicate

Pure data and pure functions; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal, get_args

from vcdl.errors import LedgerError

RunState = Literal["created", "running", "completed", "failed", "interrupted"]
SubtaskState = Literal["pending", "running", "merged", "failed", "dropped", "deferred"]
AttemptState = Literal[
    "running",
    "finished",
    "interrupted",
    "merged",
    "rejected",
    "duplicate",
    "failed",
    "killed",
    "timeout",
]

RUN_STATES: Final = frozenset[str](get_args(RunState))
SUBTASK_STATES: Final = frozenset[str](get_args(SubtaskState))
ATTEMPT_STATES: Final = frozenset[str](get_args(AttemptState))

# -- named subsets ----------------------------------------------------------------

ENDED_RUN_STATES: Final = frozenset({"completed", "failed", "interrupted"})
"""A run in one of these is not being driven (until it is resumed)."""

TERMINAL_SUBTASK_STATES: Final = frozenset({"merged", "dropped", "failed"})
"""Nothing more happens to such a subtask: no attempt, no merge."""

BARRIER_SUBTASK_STATES: Final = TERMINAL_SUBTASK_STATES | {"deferred"}
"""States every subtask of an epoch is in once the epoch has passed its barrier."""

MERGEABLE_ATTEMPT_STATES: Final = frozenset({"finished", "interrupted"})
"""An attempt with a stored result the assimilator may still merge."""

RESUMABLE_ATTEMPT_STATES: Final = frozenset({"running", "killed", "timeout"})
"""An unfinished attempt whose last checkpoint a replacement may resume."""

USEFUL_ATTEMPT_STATES: Final = frozenset({"merged"})
"""What cost accounting counts as useful work."""

PENDING_ATTEMPT_STATES: Final = frozenset({"running", "finished", "interrupted"})
"""Undecided while the run goes on: the attempt may still be merged."""

WASTE_ATTEMPT_STATES: Final = frozenset({"killed", "timeout", "rejected", "duplicate", "failed"})
"""Work that will never be merged."""

# -- allowed moves ------------------------------------------------------------------

SUBTASK_MOVES: Final[Mapping[str, frozenset[str]]] = {
    # running -> running: a further attempt (a reissue) claims it.
    "pending": frozenset({"running", "merged", "failed", "dropped", "deferred"}),
    "running": frozenset({"running", "merged", "failed", "dropped", "deferred"}),
    "deferred": frozenset({"running", "merged", "failed", "dropped", "deferred"}),
    "merged": frozenset(),
    "failed": frozenset(),
    "dropped": frozenset(),
}

ATTEMPT_MOVES: Final[Mapping[str, frozenset[str]]] = {
    # running -> duplicate: a result that comes in for a subtask another
    # attempt merged already (vcdl.ledger.work.WorkQueries.finish_attempt), in
    # the same statement, not at a later settle that may never come. A result
    # for a subtask closed without a merge (dropped, failed) is recorded
    # rejected by that statement: finished, then rejected, two moves in one
    # (the driver itself cannot reject an attempt that has no result yet).
    "running": frozenset({"finished", "interrupted", "failed", "killed", "timeout", "duplicate"}),
    "finished": frozenset({"merged", "rejected", "duplicate"}),
    "interrupted": frozenset({"merged", "rejected", "duplicate"}),
    # Given up on by the driver but alive after all (a worker leaving under
    # notice finishes its attempt): its end is a fact too, and a duplicate
    # of a merged subtask once the driver settles the epoch.
    "killed": frozenset({"finished", "interrupted", "failed", "duplicate"}),
    "timeout": frozenset({"finished", "interrupted", "failed", "duplicate"}),
    "merged": frozenset(),
    "rejected": frozenset(),
    "duplicate": frozenset(),
    "failed": frozenset(),
}

RUN_MOVES: Final[Mapping[str, frozenset[str]]] = {
    "created": frozenset({"running", "failed", "interrupted"}),
    "running": frozenset({"running", "completed", "failed", "interrupted"}),
    # A finished, failed or interrupted (Ctrl-C, SIGTERM) run is resumed (more
    # epochs, after a fix, or where it stopped).
    "completed": frozenset({"running"}),
    "failed": frozenset({"running", "failed"}),
    "interrupted": frozenset({"running", "failed", "interrupted"}),
}


def sources(moves: Mapping[str, frozenset[str]], target: str) -> frozenset[str]:
    """The states from which ``target`` may be reached."""
    return frozenset(s for s, targets in moves.items() if target in targets)


class IllegalTransition(LedgerError):
    """A change of state the lifecycle does not allow; names both states."""


def _check(kind: str, moves: Mapping[str, frozenset[str]], old: str, new: str, what: str) -> None:
    if new not in moves:
        raise IllegalTransition(f"{what}: unknown {kind} state {new!r}; one of {sorted(moves)}")
    if new not in moves.get(old, frozenset()):
        allowed = sorted(moves.get(old, frozenset()))
        article = "an" if kind[0] in "aeiou" else "a"
        raise IllegalTransition(
            f"{what}: {article} {kind} cannot go from {old!r} to {new!r} "
            f"(from {old!r}: {', '.join(allowed) or 'nothing, it is final'})"
        )


def check_subtask_move(old: str, new: str, what: str = "subtask") -> None:
    """Raise :class:`IllegalTransition` unless a subtask may go from ``old`` to ``new``."""
    _check("subtask", SUBTASK_MOVES, old, new, what)


def check_attempt_move(old: str, new: str, what: str = "attempt") -> None:
    """Raise :class:`IllegalTransition` unless an attempt may go from ``old`` to ``new``."""
    _check("attempt", ATTEMPT_MOVES, old, new, what)


def check_run_move(old: str, new: str, what: str = "run") -> None:
    """Raise :class:`IllegalTransition` unless a run may go from ``old`` to ``new``."""
    _check("run", RUN_MOVES, old, new, what)
