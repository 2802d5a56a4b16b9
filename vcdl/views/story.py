"""The story of a subtask: everything that happened to it, in order, from the ledger.

``vcdl story RUN [--epoch E] [--shard S]``: for each subtask, its attempts
(which worker, from which base version, resumed from which checkpoint), how
each ended (a result, a partial result under a preemption notice, killed,
timed out, rejected and why, a late duplicate), the reissues, and the merge
that made its version (α, staleness), or why it was closed otherwise
(failed, dropped, deferred). The epoch's state machine keeps a log of its own
decisions (``EpochState.story``) while a driver runs; the ledger's facts are
what outlives the driver, so the story is told from them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from vcdl.ledger import Attempt, Ledger, Subtask, Version

_ENDED = {
    "finished": "returned its result",
    "interrupted": "handed in a partial result under a preemption notice",
    "killed": "was killed",
    "timeout": "timed out",
    "rejected": "had its result rejected",
    "duplicate": "returned a result its subtask no longer needed (a duplicate)",
    "merged": "returned its result",  # merged: the merge's own moment follows
    "failed": "failed",
}


@dataclass(frozen=True)
class Moment:
    """One thing that happened to a subtask."""

    at: datetime
    event: str
    attempt: int | None = None
    worker: str | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"at": self.at.isoformat()}


@dataclass(frozen=True)
class Story:
    """A subtask and its moments, oldest first."""

    epoch: int
    shard: int
    state: str
    attempts: int
    merged_version: int | None
    reason: str | None
    moments: list[Moment] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "shard": self.shard,
            "state": self.state,
            "attempts": self.attempts,
            "merged_version": self.merged_version,
            "reason": self.reason,
            "events": [m.to_dict() for m in self.moments],
        }


def _started(a: Attempt, numbers: dict[str, int]) -> Moment:
    detail = f"from v{a.base_version}"
    if a.resumed_from is not None:
        source = numbers.get(a.resumed_from)
        detail += f", resuming attempt {source}'s checkpoint" if source else ", from a checkpoint"
    event = "attempt started" if a.number == 1 else "attempt started (reissued)"
    return Moment(a.started_at, event, a.number, a.worker, detail)


def _ended(a: Attempt) -> Moment | None:
    if a.state == "running" or a.finished_at is None:
        return None
    what = _ENDED.get(a.state, a.state)
    parts = [f"{a.samples} samples"] if a.samples is not None else []
    if a.reason:
        parts.append(a.reason)
    return Moment(a.finished_at, f"attempt {what}", a.number, a.worker, "; ".join(parts))


def _merged(v: Version, numbers: dict[str, int]) -> list[Moment]:
    number = numbers.get(v.attempt_id or "")
    alpha = f"alpha {v.alpha:.3f}" if v.alpha is not None else "alpha ?"
    out = [
        Moment(
            v.created_at,
            f"merged as v{v.number}",
            number,
            None,
            f"{alpha}, staleness {v.staleness}",
        )
    ]
    if v.pruned_at is not None:
        out.append(Moment(v.pruned_at, f"v{v.number}'s weights let go by retention"))
    return out


def tell(subtask: Subtask, attempts: Iterable[Attempt], version: Version | None) -> Story:
    """The story of ``subtask`` from its attempts' rows and its merged version's."""
    rows = sorted(attempts, key=lambda a: a.number)
    numbers = {a.id: a.number for a in rows}
    moments: list[Moment] = []
    for a in rows:
        moments.append(_started(a, numbers))
        ended = _ended(a)
        if ended is not None:
            moments.append(ended)
    if version is not None:
        moments += _merged(version, numbers)
    if subtask.state in ("failed", "dropped", "deferred") and subtask.reason:
        last = max((m.at for m in moments), default=None)
        if last is not None:
            moments.append(Moment(last, f"subtask {subtask.state}", None, None, subtask.reason))
    # Stable: a row's start before its end when the clock ties.
    moments.sort(key=lambda m: m.at)
    return Story(
        subtask.epoch,
        subtask.shard,
        subtask.state,
        subtask.attempts,
        subtask.merged_version,
        subtask.reason,
        moments,
    )


def run_stories(
    ledger: Ledger, run: str, *, epoch: int | None = None, shard: int | None = None
) -> list[Story]:
    """The stories of run ``run``'s subtasks (of ``epoch``, of ``shard``), in order."""
    subtasks = [s for s in ledger.subtasks(run, epoch) if shard is None or s.shard == shard]
    by_subtask: dict[int, list[Attempt]] = {}
    for a in ledger.attempts(run, epoch):
        by_subtask.setdefault(a.subtask_id, []).append(a)
    versions = {v.subtask_id: v for v in ledger.versions(run, epoch=epoch) if v.subtask_id}
    return [
        tell(s, by_subtask.get(s.id or -1, []), versions.get(s.id or -1))
        for s in sorted(subtasks, key=lambda s: (s.epoch, s.shard))
    ]


def format_stories(stories: Iterable[Story]) -> str:
    """The stories as a timeline for the terminal, a block per subtask."""
    blocks = []
    for s in stories:
        head = f"epoch {s.epoch} shard {s.shard}: {s.state}, {s.attempts} attempt(s)"
        if s.merged_version is not None:
            head += f", merged as v{s.merged_version}"
        lines = [head]
        for m in s.moments:
            who = f" attempt {m.attempt}" if m.attempt is not None else ""
            where = f" on {m.worker}" if m.worker else ""
            detail = f" ({m.detail})" if m.detail else ""
            lines.append(f"  {m.at:%H:%M:%S.%f}"[:-3] + f"{who}{where}: {m.event}{detail}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) if blocks else "no subtask matches"
