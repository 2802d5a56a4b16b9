"""``vcdl diff RUN OTHER``: where two runs part (a run and its what-if), and both heads' metrics.

:func:`diff_versions` is pure: the two runs' versions are paired by the
subtask each merged (epoch, shard), and the first version of ``RUN`` whose
subtask ``OTHER`` merged to other weights, or did not merge, is where they
part. :func:`diff_runs` adds each head's test metrics: the recorded
evaluation of the head, else one made now (and recorded, as ``vcdl
evaluate`` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from vcdl.ledger import Attempt, Version
from vcdl.ledger.models import FOLDED_CHECKSUM
from vcdl.ledger.versions import evaluation_metrics
from vcdl.runtime import RunRef


@dataclass
class RunDiff:
    """How two runs' lineages compare."""

    run: str
    other: str
    common: int  # versions from 1 on that are the same weights for the same subtask
    parted_at: int | None  # the run's first version that differs (None: none does)
    parted_subtask: tuple[int, int] | None
    only_in_run: list[tuple[int, int]]  # subtasks merged in the run, not in the other
    only_in_other: list[tuple[int, int]]
    heads: tuple[int, int]
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _merged(
    versions: Sequence[Version], attempts: Sequence[Attempt]
) -> dict[tuple[int, int], Version]:
    shard = {a.id: (a.epoch, a.shard) for a in attempts}
    return {shard[v.attempt_id]: v for v in versions if v.attempt_id in shard}


def diff_versions(
    run: str,
    versions: Sequence[Version],
    attempts: Sequence[Attempt],
    other: str,
    other_versions: Sequence[Version],
    other_attempts: Sequence[Attempt],
) -> RunDiff:
    """Pair the two runs' versions by subtask; where they part (pure)."""
    mine, theirs = _merged(versions, attempts), _merged(other_versions, other_attempts)
    common, parted, where = 0, None, None
    for v in sorted(versions, key=lambda v: v.number):
        if v.number == 0:
            continue
        key = next((k for k, m in mine.items() if m.number == v.number), None)
        twin = theirs.get(key) if key is not None else None
        same = (
            twin is not None
            and twin.number == v.number
            and v.checksum == twin.checksum != FOLDED_CHECKSUM
        )
        if not same:
            parted, where = v.number, key
            break
        common += 1
    heads = (
        max((v.number for v in versions), default=0),
        max((v.number for v in other_versions), default=0),
    )
    return RunDiff(
        run,
        other,
        common,
        parted,
        where,
        sorted(set(mine) - set(theirs)),
        sorted(set(theirs) - set(mine)),
        heads,
    )


def head_metrics(ref: RunRef) -> dict[str, float]:
    """The head's test metrics: as recorded, else evaluated now (and recorded)."""
    from vcdl.driver.runs import evaluate_version

    ledger = ref.ledger(fenced=False)
    head = ledger.head(ref.run).number
    done = [e for e in ledger.evaluations(ref.run) if e.version == head and e.split == "test"]
    evaluation = done[-1] if done else evaluate_version(ref, ref.config(), head)
    return evaluation_metrics(evaluation)


def diff_runs(ref: RunRef, other: RunRef) -> RunDiff:
    """:func:`diff_versions` of two runs' ledgers, with each head's test metrics."""
    a, b = ref.ledger(fenced=False), other.ledger(fenced=False)
    told = diff_versions(
        ref.run,
        a.versions(ref.run),
        a.attempts(ref.run),
        other.run,
        b.versions(other.run),
        b.attempts(other.run),
    )
    told.metrics = {ref.run: head_metrics(ref), other.run: head_metrics(other)}
    return told


def diff_text(d: RunDiff) -> str:
    """The diff as lines for the terminal."""
    if d.parted_at is None:
        head = f"{d.run} and {d.other}: the same {d.common} versions"
    else:
        sub = (
            f" (epoch {d.parted_subtask[0]}, shard {d.parted_subtask[1]})"
            if d.parted_subtask
            else ""
        )
        head = (
            f"{d.run} and {d.other} part at version {d.parted_at}{sub}, after {d.common} the same"
        )
    lines = [head, f"  heads: {d.run} v{d.heads[0]}, {d.other} v{d.heads[1]}"]
    for name, subtasks in ((d.run, d.only_in_run), (d.other, d.only_in_other)):
        if subtasks:
            shown = ", ".join(f"e{e}/s{s}" for e, s in subtasks[:10])
            lines.append(f"  merged only in {name}: {shown}")
    for name, metrics in d.metrics.items():
        shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items()))
        lines.append(f"  {name} head, test: {shown}")
    return "\n".join(lines)
