"""The story of a subtask: everything that happened to it, in order, from the ledger.

This module owns the facts of ``vcdl story RUN [--epoch E] [--shard S]``:
:func:`tell` (pure) turns one subtask's ledger rows (the subtask, its
attempts, its merged version, the driver's decisions about it) into
:class:`StoryEvent` s, oldest first: each attempt's start (a reissue if it
is not the first; from which base version, resuming which attempt's
checkpoint), how it ended (a result, a partial result under a preemption
notice, killed, timed out, failed, rejected and why, a late duplicate), the
merge and the version it made (α, staleness, parent), retention letting that
version's weights go, and why the subtask was closed otherwise (failed,
dropped, deferred). Every time is also given in seconds from the run's
start. :func:`read_story` reads the rows and refuses an epoch or a shard
that does not exist, naming those that do. The text is
:mod:`vcdl.views.story_text`'s.

The story is told from the ledger because the ledger is what outlives the
driver. The epoch's state machine keeps a bounded log of its own decisions
(``EpochState.story``) only while its driver runs; what of it no attempt row
shows, the driver records as it decides (``decision`` rows,
:mod:`vcdl.ledger.decisions`, written by ``flows/epoch.py``), and
:func:`tell` merges them in time order: a task that a worker under notice
handed back before claiming an attempt (``handed_back``, with the worker),
each reissue and the reason it was decided with (``reissue``; an attempt
row's ``reissued`` says only that a later attempt started), and when and
why a subtask was closed (a recorded ``closed``; else, for a run recorded
before them, a ``closed`` put after the last event). So they are told after
the driver is gone, also after a killed driver and ``vcdl resume``, and of
a subtask deferred by the quorum and merged in a later epoch. The ledger
keeps a subtask's first :data:`~vcdl.ledger.models.DECISIONS_PER_SUBTASK`
decisions; a kind this vcdl does not know is told as ``decided``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Literal

from vcdl.errors import SubtaskNotFound
from vcdl.ledger import Attempt, Decision, Ledger, Subtask, Version
from vcdl.ledger.models import DECISIONS_PER_SUBTASK, FOLDED_CHECKSUM

EventKind = Literal[
    "started",
    "reissued",
    "returned",
    "notice",
    "killed",
    "timeout",
    "failed",
    "rejected",
    "duplicate",
    "merged",
    "pruned",
    "closed",
    "handed_back",
    "reissue",
    "decided",
]
"""What an event is, as a stable token (docs/cli.md lists them)."""

#: The kind of the event that ends an attempt in each state (running ones have none).
_END_KIND: dict[str, EventKind] = {
    "finished": "returned",
    "merged": "returned",
    "interrupted": "notice",
    "killed": "killed",
    "timeout": "timeout",
    "failed": "failed",
    "rejected": "rejected",
    "duplicate": "duplicate",
}

#: The driver's decisions (``decision.kind``) that are events of their own kind.
_DECIDED: dict[str, EventKind] = {
    "handed_back": "handed_back",
    "reissue": "reissue",
    "closed": "closed",
}

#: Subtask states that close a subtask without a merge; the reason says why.
CLOSED_STATES = ("failed", "dropped", "deferred")


@dataclass(frozen=True)
class StoryEvent:
    """One thing that happened to a subtask: when, what, which attempt, where."""

    at: datetime
    seconds: float
    """Seconds from the run's start (the run row's creation) to ``at``."""
    kind: EventKind
    attempt: int | None = None
    worker: str | None = None
    """The worker's address (``tcp://host:port``)."""
    version: int | None = None
    """The version a merge made (``merged``, ``pruned``); the base an attempt started from
    (``started``, ``reissued``)."""
    detail: str = ""
    worker_name: str | None = None
    """The worker's Dask name (``dask worker --name``), where the ledger has it: stable
    across the worker's restarts and a resumed driver's new cluster, unlike its address."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"at": self.at.isoformat(), "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class Story:
    """A subtask and its events, oldest first."""

    epoch: int
    shard: int
    state: str
    attempts: int
    merged_version: int | None
    reason: str | None
    events: list[StoryEvent] = field(default_factory=list)
    outcomes: list[tuple[int, str]] = field(default_factory=list)
    """Each attempt's number and state, in order: the compact line's summary."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "shard": self.shard,
            "state": self.state,
            "attempts": self.attempts,
            "merged_version": self.merged_version,
            "reason": self.reason,
            "events": [e.to_dict() for e in self.events],
        }

    @property
    def eventful(self) -> bool:
        """Anything but one attempt that was merged: what a capped summary keeps."""
        return self.state != "merged" or len(self.outcomes) != 1 or self.handed_back > 0

    @property
    def handed_back(self) -> int:
        """Tasks that workers under a preemption notice handed back untrained."""
        return sum(1 for e in self.events if e.kind == "handed_back")


@dataclass(frozen=True)
class RunStory:
    """The stories ``vcdl story`` asked for, with the run's start and what was asked."""

    run: str
    started_at: datetime
    epoch: int | None
    shard: int | None
    epochs: int | None
    """The run's configured epochs (None where its config does not say)."""
    stories: list[Story]

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "started_at": self.started_at.isoformat(),
            "epoch": self.epoch,
            "shard": self.shard,
            "subtasks": [s.to_dict() for s in self.stories],
        }


def under_notice(a: Attempt) -> bool:
    """Whether the attempt handed in a partial result under a preemption notice.

    Its state says so until it is merged; after that only its reason does (the
    worker records "stopped at a batch boundary by a preemption notice").
    """
    return a.state == "interrupted" or "preemption notice" in (a.reason or "")


def _since(start: datetime, at: datetime) -> float:
    return (at - start).total_seconds()


def _started(a: Attempt, numbers: dict[str, int], start: datetime) -> StoryEvent:
    detail = f"from v{a.base_version}"
    if a.resumed_from is not None:
        source = numbers.get(a.resumed_from)
        where = f"attempt {source}'s" if source is not None else "another subtask's"
        detail += f", resuming {where} checkpoint"
        if a.resumed_seconds is not None:
            detail += f" ({a.resumed_seconds:.1f} s trained)"
    kind: EventKind = "started" if a.number == 1 else "reissued"
    at = a.started_at
    return StoryEvent(
        at, _since(start, at), kind, a.number, a.worker, a.base_version, detail, a.worker_name
    )


def _ended(a: Attempt, start: datetime) -> StoryEvent | None:
    if a.state == "running" or a.finished_at is None:
        return None
    kind = _END_KIND.get(a.state, "failed")
    if kind == "returned" and under_notice(a):
        kind = "notice"
    parts = []
    if a.samples is not None:
        parts.append(f"{a.samples} samples")
    if a.loss is not None and kind in ("returned", "notice"):
        parts.append(f"loss {a.loss:.4g}")
    if a.reason and kind != "notice":  # a notice's reason is its kind
        parts.append(a.reason)
    at = a.finished_at
    return StoryEvent(
        at, _since(start, at), kind, a.number, a.worker, None, ", ".join(parts), a.worker_name
    )


def _merged(v: Version, numbers: dict[str, int], start: datetime) -> list[StoryEvent]:
    number = numbers.get(v.attempt_id or "")
    parts = [f"alpha {v.alpha:.3g}" if v.alpha is not None else "alpha unknown"]
    if v.staleness is not None:
        parts.append(f"staleness {v.staleness}")
    if v.parent is not None:
        parts.append(f"onto v{v.parent}")
    if v.checksum == FOLDED_CHECKSUM:
        parts.append("folded: its weights were stored only with a later version")
    at = v.created_at
    out = [StoryEvent(at, _since(start, at), "merged", number, None, v.number, ", ".join(parts))]
    # A folded version is recorded pruned as it is made: nothing was let go later.
    if v.pruned_at is not None and v.checksum != FOLDED_CHECKSUM:
        at = v.pruned_at
        detail = "its weights let go by the retention policy (store.keep)"
        out.append(StoryEvent(at, _since(start, at), "pruned", None, None, v.number, detail))
    return out


def _decided(decisions: Sequence[Decision], start: datetime) -> list[StoryEvent]:
    """The driver's recorded decisions as events (an unknown kind is told as it is)."""
    out = []
    for d in sorted(decisions, key=lambda d: (d.at, d.id or 0)):
        # A kind this vcdl does not know (a newer one recorded it) is told with its name.
        kind = _DECIDED.get(d.kind, "decided")
        detail = d.detail if d.kind in _DECIDED else f"{d.kind}: {d.detail}"
        out.append(StoryEvent(d.at, _since(start, d.at), kind, None, d.worker, None, detail))
    if len(decisions) >= DECISIONS_PER_SUBTASK and out:
        last = out[-1]
        kept = f"the ledger keeps a subtask's first {DECISIONS_PER_SUBTASK} decisions"
        out[-1] = StoryEvent(
            last.at, last.seconds, last.kind, None, last.worker, None, f"{last.detail} ({kept})"
        )
    return out


def tell(
    subtask: Subtask,
    attempts: Iterable[Attempt],
    version: Version | None,
    start: datetime,
    decisions: Sequence[Decision] = (),
) -> Story:
    """The story of ``subtask`` from its attempts' rows, its merged version's row and the
    driver's recorded ``decisions`` about it.

    ``start`` is the run's start: each event's ``seconds`` count from it.
    Events are in time order; at equal times, in the order they happened
    (an attempt's start before its end, its end before the merge; a
    decision after the attempts' events of its time).
    """
    rows = sorted(attempts, key=lambda a: a.number)
    numbers = {a.id: a.number for a in rows}
    events: list[StoryEvent] = []
    for a in rows:
        events.append(_started(a, numbers, start))
        ended = _ended(a, start)
        if ended is not None:
            events.append(ended)
    if version is not None:
        events += _merged(version, numbers, start)
    events += _decided(decisions, start)
    # Stable: ties keep the order above.
    events.sort(key=lambda e: e.at)
    recorded_close = any(d.kind == "closed" for d in decisions)
    if subtask.state in CLOSED_STATES and not recorded_close:
        # The ledger keeps no time for a subtask's closing: it is after its last event.
        at = events[-1].at if events else start
        detail = subtask.reason or ""
        events.append(StoryEvent(at, _since(start, at), "closed", None, None, None, detail))
    return Story(
        epoch=subtask.epoch,
        shard=subtask.shard,
        state=subtask.state,
        attempts=max(subtask.attempts, len(rows)),
        merged_version=subtask.merged_version,
        reason=subtask.reason,
        events=events,
        outcomes=[(a.number, _outcome(a)) for a in rows],
    )


def _outcome(a: Attempt) -> str:
    """An attempt's end in a word or two: its state, and that it was partial."""
    if under_notice(a) and a.state in ("merged", "interrupted"):
        return f"{a.state} (partial)" if a.state == "merged" else "partial"
    return a.state


def _spans(numbers: Iterable[int]) -> str:
    """Numbers as ranges: 0-3, 5, 7-9."""
    out: list[str] = []
    run: list[int] = []
    for n in sorted(set(numbers)):
        if run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [n]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


def configured_epochs(config: str) -> int | None:
    """The epochs a run's stored config plans; None where it cannot be read."""
    # Read leniently: a story is told of any run, whatever its config's version.
    try:
        epochs = json.loads(config).get("run", {}).get("epochs")
    except (ValueError, AttributeError):
        return None
    return epochs if isinstance(epochs, int) else None


def check_selection(
    run: str,
    subtasks: Sequence[Subtask],
    *,
    epoch: int | None,
    shard: int | None,
    epochs: int | None,
) -> None:
    """Raise :class:`SubtaskNotFound`, naming what exists, if ``epoch`` or ``shard`` is
    not among ``subtasks`` (the run's, all of them, or ``epoch``'s)."""
    planned = f" ({epochs} planned)" if epochs is not None else ""
    if not subtasks:
        raise SubtaskNotFound(
            f"run {run!r} has no subtasks yet: no epoch has started{planned}"
            if epoch is None
            else f"run {run!r} has no epoch {epoch}; none has started yet{planned}"
        )
    if epoch is not None and all(s.epoch != epoch for s in subtasks):
        have = _spans(s.epoch for s in subtasks)
        raise SubtaskNotFound(f"run {run!r} has no epoch {epoch}: its epochs are {have}{planned}")
    if shard is not None:
        mine = [s for s in subtasks if epoch is None or s.epoch == epoch]
        if all(s.shard != shard for s in mine):
            whose = f"epoch {epoch} of run {run!r}" if epoch is not None else f"run {run!r}"
            have = _spans(s.shard for s in mine)
            raise SubtaskNotFound(f"{whose} has no shard {shard}: its shards are {have}")


def _key(s: Subtask) -> tuple[int, int]:
    """A subtask's (epoch, shard)."""
    return s.epoch, s.shard


def read_story(
    ledger: Ledger, run: str, *, epoch: int | None = None, shard: int | None = None
) -> RunStory:
    """The stories of run ``run``'s subtasks (of ``epoch``, of ``shard``), by epoch and shard.

    Raises :class:`~vcdl.errors.RunNotFound` for an unknown run and
    :class:`~vcdl.errors.SubtaskNotFound` for an epoch or shard it does not have.
    """
    row = ledger.get_run(run)
    epochs = configured_epochs(row.config)
    subtasks = ledger.subtasks(run, epoch)
    if epoch is not None and not subtasks:
        # Only to name the epochs there are: the run's every subtask is read on error only.
        check_selection(run, ledger.subtasks(run), epoch=epoch, shard=shard, epochs=epochs)
    check_selection(run, subtasks, epoch=epoch, shard=shard, epochs=epochs)
    chosen = [s for s in subtasks if shard is None or s.shard == shard]
    ids = {s.id for s in chosen}
    by_subtask: dict[int | None, list[Attempt]] = {}
    for a in ledger.attempts(run, epoch):
        if a.subtask_id in ids:
            by_subtask.setdefault(a.subtask_id, []).append(a)
    decided: dict[tuple[int, int], list[Decision]] = {}
    for d in ledger.decisions(run, epoch, shard):
        decided.setdefault((d.epoch, d.shard), []).append(d)
    versions = {v.subtask_id: v for v in ledger.versions(run, epoch=epoch) if v.subtask_id in ids}
    start = row.created_at
    stories = [
        tell(s, by_subtask.get(s.id, []), versions.get(s.id), start, decided.get(_key(s), []))
        for s in sorted(chosen, key=lambda s: (s.epoch, s.shard))
    ]
    return RunStory(run, start, epoch, shard, epochs, stories)
