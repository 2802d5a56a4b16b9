"""The merge decision, pure: what merging one result, or a fold of several, will do.

:func:`plan_merge` works out, from the ledger's facts and nothing else, each
result's staleness against the head it will meet, the α its rule gives
(:meth:`~vcdl.merge.rules.MergeRule.alpha`), the α the blend uses (more for a
partial result, which counts for the share of its planned samples it
trained), the version number and group path each result becomes, and the
attributes of the version group that is written. The assimilator
(:func:`~vcdl.driver.assimilator.merge_attempt`) and the fold
(:func:`~vcdl.driver.fold.fold_attempts`) only carry plans out: read, blend,
write, commit. One decision, written once, tested without a store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vcdl.ledger import Attempt
from vcdl.merge.rules import MergeRule
from vcdl.store.paths import version_path, version_tag


@dataclass(frozen=True)
class Candidate:
    """What the plan needs of one result: its attempt's facts and its planned samples."""

    attempt_id: str
    epoch: int
    shard: int
    base_version: int
    partial: bool  # handed in early (a preemption notice): counts for its share
    samples: int | None
    planned_samples: int | None
    size_share: float | None = None
    """Its shard's rows over the epoch's mean shard's, under a throughput plan
    (``cluster.sizing``); None: the even plan, every shard weighs alike."""

    @classmethod
    def of(cls, attempt: Attempt, result_attrs: Mapping[str, Any]) -> Candidate:
        """The candidate of ``attempt`` whose result group has ``result_attrs``.

        Read once, when the result is opened: the planned samples come from
        the result's own attributes, never from a version's.
        """
        planned = result_attrs.get("planned_samples")
        share = result_attrs.get(SIZE_SHARE)
        return cls(
            attempt.id,
            attempt.epoch,
            attempt.shard,
            attempt.base_version,
            attempt.state == "interrupted",
            attempt.samples,
            planned if isinstance(planned, int) and planned > 0 else None,
            float(share) if isinstance(share, int | float) and share > 0 else None,
        )

    def blend_alpha(self, alpha: float) -> float:
        """The α the blend uses: ``alpha``, or more for a partial result.

        A partial result counts in proportion to the samples it saw: the
        result scaled towards the head by f, then merged with alpha, is the
        head merged with the raw result at 1 - (1 - alpha) * f; one pass and
        no scaled copy of the result.
        """
        fraction: float | None = None
        if self.partial and self.samples is not None:
            planned = self.planned_samples or max(1, self.samples)
            fraction = min(1.0, self.samples / planned)
        return blend_of(alpha, fraction, self.size_share)


SIZE_SHARE = "size_share"
"""The result group's attribute: its shard's rows over the epoch's mean shard's."""


def blend_of(alpha: float, fraction: float | None, share: float | None) -> float:
    """The blend α of a result: the head's weight, 1 - the result's.

    The result weighs ``(1 - alpha)`` times the share of its planned samples
    it trained (``fraction``, a partial result; None: all) times its shard's
    size relative to the epoch's mean shard (``share``, a throughput plan;
    None: even shards), at most 1 (the result replaces the head; a weight
    over 1 would extrapolate past it). With ``share`` None this is the even
    plan's formula, unchanged to the bit.
    """
    if share is None:
        if fraction is None:
            return alpha
        return 1.0 - (1.0 - alpha) * fraction
    weight = (1.0 - alpha) * (1.0 if fraction is None else fraction) * share
    return 1.0 - min(1.0, weight)


@dataclass(frozen=True)
class MergeStep:
    """One result's place in a plan: the version it becomes and how it is blended."""

    attempt_id: str
    number: int
    alpha: float  # the rule's α, recorded in the ledger
    blend: float  # the α the blend uses (a partial result's scaling included)
    staleness: int
    path: str  # the version group it would be written to


@dataclass(frozen=True)
class MergePlan:
    """What merging ``steps`` onto head ``head`` does; only the last step's group is written."""

    run: str
    head: int
    epoch: int
    shard: int  # the last step's
    steps: tuple[MergeStep, ...]

    @property
    def last(self) -> MergeStep:
        return self.steps[-1]

    @property
    def number(self) -> int:
        """The version the head becomes."""
        return self.last.number

    @property
    def path(self) -> str:
        """The version group that is written (the last step's)."""
        return self.last.path

    def attrs(self) -> dict[str, Any]:
        """The written version group's attributes (a fold lists the versions it skipped)."""
        attrs: dict[str, Any] = {
            "run": self.run,
            "number": self.number,
            "parent": self.number - 1,
            "attempt": self.last.attempt_id,
            "epoch": self.epoch,
            "shard": self.shard,
            "alpha": self.last.alpha,
            "staleness": self.last.staleness,
        }
        if len(self.steps) > 1:
            # The versions before it in this fold: recorded in the ledger, never stored.
            attrs["folded"] = [s.attempt_id for s in self.steps[:-1]]
        return attrs


@dataclass(frozen=True)
class Rejection:
    """Why a result cannot be merged now (past ``merge.max_staleness``)."""

    attempt_id: str
    staleness: int
    reason: str


def plan_merge(
    rule: MergeRule,
    *,
    run: str,
    lease: int | None,
    head: int,
    epochs: int,
    max_staleness: int | None,
    merged_in_epoch: int,
    candidates: Sequence[Candidate],
) -> MergePlan | Rejection:
    """Plan merging ``candidates``, in order, onto version ``head``.

    Each result is planned as if merged one at a time: the i-th meets head
    ``head + i`` (its staleness counts from there) with ``merged_in_epoch +
    i`` of its epoch merged before it. A fold (several candidates) must be of
    one epoch. The first candidate the rule refuses as stale is the
    :class:`Rejection`; nothing is planned for the others.
    """
    if not candidates:
        raise ValueError("plan_merge needs at least one result")
    epoch = candidates[0].epoch
    if any(c.epoch != epoch for c in candidates):
        raise ValueError("a fold merges results of one epoch only")
    steps = []
    for i, c in enumerate(candidates):
        staleness = head + i - c.base_version
        alpha = rule.alpha(epoch, epochs, staleness, merged_in_epoch + i)
        if alpha is None:
            return Rejection(
                c.attempt_id, staleness, f"stale: staleness {staleness} > {max_staleness}"
            )
        number = head + i + 1
        path = version_path(run, number, version_tag(c.attempt_id, lease))
        steps.append(MergeStep(c.attempt_id, number, alpha, c.blend_alpha(alpha), staleness, path))
    return MergePlan(run, head, epoch, candidates[-1].shard, tuple(steps))
