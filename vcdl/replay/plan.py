"""A replay's plan, pure: which merges to re-execute and which trainings each needs.

:func:`plan_replay` reads the ledger's rows (versions, attempts) and nothing
else. Each merged version in the range becomes a :class:`MergeStep` carrying
what its rule read: the attempt, its base version, the recorded α and
staleness, whether the result was partial, the checksum to compare with. Each
attempt to re-train becomes a :class:`Training`: a merged attempt, and
recursively the attempts it continued from (the checkpoint it resumed, at that
checkpoint's samples; the worker's optimizer state or EASGD variable it
carried, at their attempt's end), in an order where every training comes after
those it needs. What cannot be replayed raises :class:`NotReplayable`, one line
saying which attempt or version and why (a run recorded before ledger migration
0011 has no replay inputs).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vcdl.errors import VcdlError
from vcdl.ledger import Attempt, Version
from vcdl.ledger.models import FOLDED_CHECKSUM
from vcdl.merge.rules import RULES


class NotReplayable(VcdlError, ValueError):
    """The run (or the asked range of it) cannot be replayed; the message says why."""

    exit_code = 2


@dataclass(frozen=True)
class Training:
    """One attempt's training to redo, up to ``samples`` of its plan (None: as recorded)."""

    attempt_id: str
    epoch: int
    shard: int
    number: int  # the attempt's number within its subtask, for messages
    base_version: int
    seed: int
    samples: int | None
    """Where to stop (a resume source's checkpoint); None: the attempt's own samples."""
    start_samples: int  # the checkpoint it resumed had seen these
    resumed_from: tuple[str, int] | None  # (attempt, samples) whose state it starts from
    optimizer_from: tuple[str, int | None] | None
    variable_from: tuple[str, int | None] | None
    variable_alpha: float | None
    device: str
    threads: int

    @property
    def key(self) -> tuple[str, int | None]:
        return (self.attempt_id, self.samples)


@dataclass(frozen=True)
class MergeStep:
    """One version to re-make: the result of ``attempt_id`` merged onto version ``number - 1``."""

    number: int
    attempt_id: str
    epoch: int
    shard: int
    base_version: int
    alpha: float
    staleness: int
    checksum: str
    kept: bool  # the version's weights are in the store (neither pruned nor folded)
    folded: bool  # written as part of a fold: the ledger has no checksum to compare with
    training: tuple[str, int | None]  # the key of the attempt's Training
    rule: str | None = None
    """The rule that merged it when not the run's: a what-if that changed the rule from a
    version on records the original's rule in the replay inputs of the attempts it merged
    before (``merge_rule``)."""


@dataclass(frozen=True)
class ReplayPlan:
    """What replaying versions ``first + 1`` to ``last`` of ``run`` re-executes, in order."""

    run: str
    first: int
    last: int
    merges: tuple[MergeStep, ...]
    trainings: tuple[Training, ...]
    """Every training, each after the trainings it needs."""
    bases: frozenset[int] = field(default_factory=frozenset)
    """Versions some training starts from (kept in memory while replayed)."""

    @property
    def devices(self) -> list[str]:
        return sorted({t.device for t in self.trainings})


def replay_inputs(attempt: Attempt) -> dict[str, Any] | None:
    """The attempt's recorded replay inputs (``attempt.replay_inputs``), or None."""
    if not attempt.replay_inputs:
        return None
    try:
        value = json.loads(attempt.replay_inputs)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _who(a: Attempt) -> str:
    return f"attempt {a.id[:12]} (epoch {a.epoch}, shard {a.shard}, attempt {a.number})"


def plan_replay(
    run: str,
    versions: Sequence[Version],
    attempts: Sequence[Attempt],
    *,
    first: int = 0,
    last: int | None = None,
) -> ReplayPlan:
    """Plan replaying ``run``'s versions after ``first`` up to ``last`` (default: the newest).

    ``versions`` and ``attempts``: the run's rows as the ledger holds them.
    """
    by_number = {v.number: v for v in versions}
    newest = max(by_number, default=0)
    last = newest if last is None else last
    if first not in by_number:
        raise NotReplayable(f"run {run!r} has no version {first} (its newest is {newest})")
    if last not in by_number or last < first:
        raise NotReplayable(
            f"--to {last} is not a version of run {run!r} from {first} on (newest {newest})"
        )
    if last == first:
        raise NotReplayable(f"nothing to replay: --from {first} and --to {last} are one version")
    start = by_number[first]
    if start.pruned_at is not None or start.checksum == FOLDED_CHECKSUM:
        raise NotReplayable(
            f"version {first} of run {run!r} is not kept in the store (pruned or folded): "
            "replay from a version whose weights are kept (v0 always is)"
        )
    by_id = {a.id: a for a in attempts}
    trainings: dict[tuple[str, int | None], Training] = {}
    order: list[Training] = []

    def training(a: Attempt, samples: int | None, why: str) -> tuple[str, int | None]:
        key = (a.id, samples)
        if key in trainings:
            return key
        inputs = replay_inputs(a)
        if inputs is None:
            raise NotReplayable(
                f"{_who(a)}, {why}, has no replay inputs: it was recorded before ledger "
                "migration 0011 (or by an older worker), so its seeds, the checkpoint, optimizer "
                "state or variable it continued from and its device are unknown"
            )
        if inputs.get("format") != 1:
            raise NotReplayable(f"{_who(a)}: replay inputs of an unknown format")

        def source(field_name: str, what: str) -> tuple[str, int | None] | None:
            ident = inputs.get(field_name)
            if ident is None:
                return None
            src = by_id.get(str(ident))
            if src is None:
                raise NotReplayable(f"{_who(a)} continued the {what} of {ident}, not in the ledger")
            # Carried at the source's end: as many samples as it recorded.
            return training(src, src.samples, f"whose {what} {_who(a)} continued")

        start_samples = int(inputs.get("start_samples") or 0)
        resumed: tuple[str, int] | None = None
        if a.resumed_from is not None and start_samples:
            src = by_id.get(a.resumed_from)
            if src is None:
                raise NotReplayable(f"{_who(a)} resumed {a.resumed_from}, not in the ledger")
            training(src, start_samples, f"whose checkpoint {_who(a)} resumed")
            resumed = (src.id, start_samples)
        optimizer = source("optimizer_from", "optimizer state")
        variable = source("variable_from", "EASGD variable")
        t = Training(
            a.id,
            a.epoch,
            a.shard,
            a.number,
            a.base_version,
            int(inputs["seed"]),
            samples,
            start_samples,
            resumed,
            optimizer,
            variable,
            inputs.get("variable_alpha"),
            str(inputs.get("device") or "cpu"),
            int(inputs.get("threads") or 1),
        )
        trainings[key] = t
        order.append(t)
        return key

    steps: list[MergeStep] = []
    for number in range(first + 1, last + 1):
        v = by_number.get(number)
        if v is None:
            raise NotReplayable(f"run {run!r} has no version {number}: its ledger has a gap")
        if v.attempt_id is None or v.attempt_id not in by_id:
            raise NotReplayable(f"version {number} of run {run!r} names no attempt to re-train")
        a = by_id[v.attempt_id]
        if v.alpha is None or v.staleness is None:
            raise NotReplayable(f"version {number} of run {run!r} records no α or staleness")
        if v.staleness != number - 1 - a.base_version:
            # The merge plan's own rule (vcdl.driver.merge_plan): a ledger otherwise is damaged.
            raise NotReplayable(
                f"version {number}: staleness {v.staleness} does not match base version "
                f"{a.base_version} and parent {number - 1}"
            )
        key = training(a, a.samples, f"merged as version {number}")
        rule = (replay_inputs(a) or {}).get("merge_rule")
        if rule is not None and rule not in RULES:
            raise NotReplayable(f"version {number} was merged by an unknown rule {rule!r}")
        folded = v.checksum == FOLDED_CHECKSUM
        steps.append(
            MergeStep(
                number,
                a.id,
                a.epoch,
                a.shard,
                a.base_version,
                v.alpha,
                v.staleness,
                v.checksum,
                not folded and v.pruned_at is None,
                folded,
                key,
                rule,
            )
        )
    bases = frozenset(t.base_version for t in order)
    for t in order:
        if t.base_version < first:
            b = by_number.get(t.base_version)
            if b is None or b.pruned_at is not None or b.checksum == FOLDED_CHECKSUM:
                raise NotReplayable(
                    f"attempt {t.attempt_id[:12]} started from version {t.base_version}, "
                    f"before --from {first} and not kept in the store: replay from an earlier "
                    "version"
                )
    return ReplayPlan(run, first, last, tuple(steps), tuple(order), bases)
