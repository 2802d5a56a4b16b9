"""The vocabulary of the epoch's state machine: facts, events in, instructions out, the policy.

:class:`~vcdl.driver.epoch_state.EpochState` is told what happened (an
:data:`Event`, carrying the ledger's facts it needs: :class:`AttemptFact`)
and answers with what to do (:data:`Instruction`); ``flows/epoch.py`` carries
the instructions out. Plain frozen data; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

from vcdl.config import RunConfig
from vcdl.states import MERGEABLE_ATTEMPT_STATES as _MERGEABLE

Key = tuple[int, int]
"""A subtask: (epoch, shard)."""


FREE_HANDBACKS = 20
"""Hand-backs from workers under notice that a subtask may see without their counting
as attempts. Such a worker leaves Dask's pool (vcdl/worker/preemption.py), so a
subtask meets one only when it was queued there before the notice; past this many
the workers are not leaving, and reissuing would spin."""


@dataclass(frozen=True)
class AttemptFact:
    """One attempt of a subtask as the ledger has it (what the rules need of the row)."""

    id: str
    key: Key
    number: int
    state: str
    samples: int | None = None
    worker: str = ""
    started_at: datetime | None = None


class _AttemptRow(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def epoch(self) -> int: ...
    @property
    def shard(self) -> int: ...
    @property
    def number(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def samples(self) -> int | None: ...
    @property
    def worker(self) -> str: ...
    @property
    def started_at(self) -> datetime: ...


def fact(row: _AttemptRow) -> AttemptFact:
    """The :class:`AttemptFact` of a ledger row."""
    return AttemptFact(
        row.id,
        (row.epoch, row.shard),
        row.number,
        row.state,
        row.samples,
        row.worker,
        row.started_at,
    )


@dataclass(frozen=True)
class EpochPolicy:
    """The run's fault settings for one epoch (``fault.*`` of the config)."""

    epoch: int
    shards: int
    final: bool = False
    max_attempts: int = 4
    attempt_timeout: float = 900.0
    partial: Literal["scale", "discard"] = "scale"
    quorum: float = 1.0
    straggler_timeout: float = 60.0
    late: Literal["reissue", "drop"] = "reissue"
    free_handbacks: int = FREE_HANDBACKS
    fold: int = 1
    """``merge.fold``: up to this many results of one epoch that wait together are merged
    in one pass (:class:`MergeGroup`); 1 merges each as it comes (:class:`Merge`)."""
    prune_every: int = 1
    """Retention runs once per this many merges (the workers: the store then holds about
    as many versions as the policy keeps plus one per worker) and at the barrier."""
    retention: bool = True
    """False when ``store.keep.all``: nothing is ever pruned."""
    pins_base: bool = False
    """The merge rule trains every shard of an epoch from the epoch's first version
    (``average``); else an attempt trains from the head at its claim."""
    workers: int = 1
    """The cluster's workers: with no more subtasks in flight than this, the epoch is in
    its tail and the next epoch may set up (vcdl/driver/epoch_loop.py)."""
    eval_device: str = "auto"
    """Where the driver evaluates: the workers' device, except "cuda" becomes "auto"
    (the driver's machine may have no GPU when the workers do)."""

    @classmethod
    def of(cls, cfg: RunConfig, epoch: int, final: bool, pins_base: bool = False) -> EpochPolicy:
        """The policy for ``epoch`` of a run with config ``cfg`` (``pins_base``: its rule's)."""
        f = cfg.fault
        return cls(
            epoch=epoch,
            shards=cfg.data.shards,
            final=final,
            max_attempts=f.max_attempts,
            attempt_timeout=f.attempt_timeout,
            partial=f.partial,
            quorum=f.quorum,
            straggler_timeout=f.straggler_timeout,
            late=f.late,
            fold=cfg.merge.fold,
            prune_every=max(1, cfg.cluster.workers),
            retention=not cfg.store.keep.all,
            pins_base=pins_base,
            workers=cfg.cluster.workers,
            eval_device="auto" if cfg.train.device == "cuda" else cfg.train.device,
        )


@dataclass(frozen=True)
class Opened:
    """The epoch starts (or restarts, after a driver died): the ledger's state."""

    todo: tuple[Key, ...]
    """Open subtasks of this epoch, and of earlier ones (deferred to it)."""
    stranded: tuple[AttemptFact, ...] = ()
    """Attempts of epochs up to this one still "running": lost with a previous driver."""
    leftovers: tuple[AttemptFact, ...] = ()
    """Finished or interrupted attempts with a result not yet merged."""
    merged: int = 0
    """This epoch's subtasks merged already."""
    head: int = 0
    """The run's head version as the epoch opens."""
    first_merged: int | None = None
    """The lowest version merged from this epoch's subtasks, if any (a resumed epoch)."""
    unevaluated: tuple[int, int] | None = None
    """(epoch, version): the previous epoch's barrier head, not evaluated yet."""


@dataclass(frozen=True)
class StartEarly:
    """A fresh epoch's shards go out in the previous epoch's tail (``cluster.overlap_epochs``).

    Only submissions: their results wait, unseen, until :class:`Opened` after the
    previous epoch's barrier, so that merges stay in epoch order.
    """

    todo: tuple[Key, ...]
    """This epoch's subtasks, all new (an epoch a driver left half done waits for
    the barrier and its :class:`Opened`)."""


@dataclass(frozen=True)
class TaskReturned:
    """A shard task returned; ``kind`` says what its worker did."""

    key: Key
    kind: Literal["finished", "interrupted", "skipped", "handed_back"]
    attempts: tuple[AttemptFact, ...]
    """The subtask's attempts as the ledger lists them now."""
    attempt_id: str | None = None
    worker: str = ""
    samples: int = 0
    planned_samples: int = 0


@dataclass(frozen=True)
class TaskLost:
    """A shard task brought no result: it raised, or every worker running it died."""

    key: Key
    reason: str
    attempts: tuple[AttemptFact, ...]
    crashed: str | None = None
    """Set when Dask gave up on the task (its workers died): the message for Prefect's
    task run, which its engine cannot finish itself."""


@dataclass(frozen=True)
class MergeDone:
    """The assimilator's outcome for a :class:`Merge` instruction."""

    key: Key
    attempt_id: str
    kind: Literal["merged", "duplicate", "rejected", "skipped"]
    reason: str | None = None
    version: int | None = None
    alpha: float | None = None
    staleness: int | None = None
    attempts: tuple[AttemptFact, ...] = ()
    """Required when ``kind`` is "rejected" or "skipped" (the result is lost: reissue)."""


@dataclass(frozen=True)
class DeadlinePassed:
    """Running attempts of a subtask in flight passed their deadline."""

    key: Key
    late: tuple[AttemptFact, ...]
    attempts: tuple[AttemptFact, ...]


@dataclass(frozen=True)
class Tick:
    """Time passed (a monotonic clock, seconds): the quorum deadline may have come."""

    now: float


@dataclass(frozen=True)
class Gathered:
    """The results already in were all handed over: merges that wait may go now."""


@dataclass(frozen=True)
class AtBarrier:
    """The epoch is at its barrier (:attr:`EpochState.finished`): what comes after it."""


Event = (
    StartEarly
    | Opened
    | TaskReturned
    | TaskLost
    | MergeDone
    | DeadlinePassed
    | Tick
    | Gathered
    | AtBarrier
)


def recorded_return(key: Key, attempts: tuple[AttemptFact, ...]) -> TaskReturned | TaskLost:
    """The event of a task that finished but whose output could not be fetched.

    A task records its attempt in the ledger before it returns, so the
    ledger knows what it did when Dask cannot say (the worker holding the
    output left). The newest mergeable attempt is the result; with none, the
    task is lost: it handed its shard back, skipped it, or its attempt failed.
    """
    mergeable = [a for a in attempts if a.key == key and a.state in _MERGEABLE]
    if not mergeable:
        return TaskLost(key, "its worker left before the driver fetched its output", attempts)
    newest = max(mergeable, key=lambda a: a.number)
    kind: Literal["finished", "interrupted"] = (
        "interrupted" if newest.state == "interrupted" else "finished"
    )
    return TaskReturned(
        key, kind, attempts, attempt_id=newest.id, worker=newest.worker, samples=newest.samples or 0
    )


@dataclass(frozen=True)
class Submit:
    """Submit the subtask's shard task; ``number`` counts its submissions (1, 2, ...).

    ``base``: the version it trains from when the rule pins the epoch's base;
    None trains from the head at its claim."""

    key: Key
    number: int
    base: int | None = None


@dataclass(frozen=True)
class Merge:
    """Merge the attempt's result; answer with :class:`MergeDone`."""

    key: Key
    attempt_id: str


@dataclass(frozen=True)
class MergeGroup:
    """Merge these results (of one epoch, in order) together; a :class:`MergeDone` each."""

    items: tuple[tuple[Key, str], ...]


@dataclass(frozen=True)
class Prune:
    """Apply the retention policy, keeping the versions in ``hold`` (being evaluated)."""

    hold: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Evaluate:
    """Evaluate a version on the test split on ``device`` and record it.

    ``version`` None: the head as it is then. ``background``: in a thread,
    beside the epoch's attempts and merges (the previous epoch's barrier
    head); :class:`AwaitEvaluation` waits for it."""

    epoch: int
    version: int | None
    device: str
    background: bool = False


@dataclass(frozen=True)
class AwaitEvaluation:
    """Wait for the background evaluation (raise what it raised)."""


@dataclass(frozen=True)
class Settle:
    """Tidy after the barrier: record late duplicates, delete checkpoints nothing resumes."""


@dataclass(frozen=True)
class FailEpoch:
    """No subtask of the epoch could be merged: the run stops, with the subtasks' reasons."""

    epoch: int


@dataclass(frozen=True)
class Advance:
    """The epoch passed its barrier: record it (``epochs_completed``), let the next one act."""

    epoch: int


@dataclass(frozen=True)
class Abandon:
    """Record that these attempts are given up on, if they are still running."""

    attempts: tuple[AttemptFact, ...]
    state: Literal["killed", "timeout"]
    reason: str


@dataclass(frozen=True)
class AbandonRunning:
    """Whatever attempts of the subtask are still running: killed (read them then)."""

    key: Key
    reason: str


@dataclass(frozen=True)
class Reject:
    """Record a result as rejected without merging it."""

    attempt_id: str
    reason: str


@dataclass(frozen=True)
class Close:
    """Set the subtask's state: failed (budget spent), dropped or deferred (quorum)."""

    key: Key
    state: Literal["failed", "dropped", "deferred"]
    reason: str


@dataclass(frozen=True)
class Cancel:
    """Forget the subtask's ``number``-th task: cancel it, and say why in its Prefect run."""

    key: Key
    number: int
    message: str


@dataclass(frozen=True)
class MarkCrashed:
    """Tell Prefect the subtask's ``number``-th task run crashed (its engine died with it)."""

    key: Key
    number: int
    message: str


NoteKind = Literal["handed_back", "reissue"]
"""What a :class:`Note` records (the ledger's ``decision.kind``; the executor records a
:class:`Close` as ``closed``)."""


@dataclass(frozen=True)
class Note:
    """Record in the ledger a decision about the subtask that its attempts cannot show.

    ``handed_back``: a worker under a preemption notice (``worker``) handed the
    task back before claiming an attempt; ``reissue``: the subtask is submitted
    again, ``detail`` says why. Fault-path only: the fault-free path notes nothing.
    """

    key: Key
    kind: NoteKind
    detail: str = ""
    worker: str = ""


@dataclass(frozen=True)
class Say:
    """A line for the run's log, at a :mod:`logging` level."""

    level: int
    message: str


Instruction = (
    Submit
    | Merge
    | MergeGroup
    | Abandon
    | AbandonRunning
    | Reject
    | Close
    | Cancel
    | MarkCrashed
    | Note
    | Say
    | Prune
    | Evaluate
    | AwaitEvaluation
    | Settle
    | FailEpoch
    | Advance
)


@dataclass(frozen=True)
class RecordDuplicate:
    """The attempt's subtask was merged from another attempt: record it, delete its result."""

    attempt_id: str
    result_uri: str | None


@dataclass(frozen=True)
class RecordLate:
    """The attempt's subtask was closed without a merge (``dropped`` at the straggler
    deadline, ``failed`` for good) before its result came in: nothing will merge it.
    Record it rejected, delete its result."""

    attempt_id: str
    result_uri: str | None
    subtask_state: str


@dataclass(frozen=True)
class DropCheckpoint:
    """Nothing resumes the attempt's checkpoint any more: forget and delete it."""

    attempt_id: str
