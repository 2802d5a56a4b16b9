"""What a what-if changes, checked before anything is trained or written (pure, torch-free).

A what-if (:mod:`vcdl.replay.whatif`) re-executes a run into a new run with
one change: one merged attempt rejected (``--reject``), or the merges made
with another α (``--alpha``, a constant replacing the run's schedule) and/or
another rule (``--rule``), from version ``--from`` on. :func:`request_problem`
refuses what makes no sense whatever the run (combinations, α outside (0, 1],
an unknown rule); :func:`plan_change` then judges the change against the run
(its config, its versions, what its attempts carried) and gives the new run's
merge settings, where the change starts, and the notes the what-if reports.
Each refusal is one line (:class:`~vcdl.replay.plan.NotReplayable`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vcdl.config import RunConfig
from vcdl.merge.interface import MergeRule
from vcdl.merge.rules import RULES
from vcdl.replay.plan import NotReplayable, ReplayPlan

__all__ = ["Change", "PlannedChange", "plan_change", "request_problem"]


@dataclass(frozen=True)
class Change:
    """The change asked for: ``reject`` alone, or ``alpha`` and/or ``rule`` from ``first``."""

    reject: str | None = None
    alpha: float | None = None
    rule: str | None = None
    first: int | None = None
    """The first version made with the change (``--from``); None: from the first merge."""


@dataclass(frozen=True)
class PlannedChange:
    """The change judged against the run: the new run's merge settings and where they start."""

    merge: dict[str, Any]
    """The keys of the ``merge`` section the new run records in place of the run's."""
    first: int
    """The first of the run's versions whose merge uses the new settings (1: all of them)."""
    rule_before: str  # the rule of the merges before ``first`` (the run's)
    rule_after: str
    notes: list[str] = field(default_factory=list)

    @property
    def changes_rule(self) -> bool:
        return self.rule_before != self.rule_after


def request_problem(change: Change) -> str | None:
    """Why the asked change makes no sense whatever the run, or None (pure)."""
    if change.reject is not None:
        if change.alpha is not None or change.rule is not None or change.first is not None:
            return (
                "--reject is a change of its own: it does not combine with --alpha, --rule or "
                "--from (the run parts from the rejected merge on anyway)"
            )
        if not change.reject:
            return "--reject needs an attempt's id (or its start)"
        return None
    if change.alpha is None and change.rule is None:
        if change.first is not None:
            return "--from VERSION with --as says where a change starts: add --alpha or --rule"
        return "--as NEW_RUN needs a change: --reject ATTEMPT, --alpha A or --rule RULE"
    if change.alpha is not None and not 0.0 < change.alpha <= 1.0:  # NaN fails too
        return f"--alpha {change.alpha}: α, the head's weight, must be in (0, 1]"
    if change.rule is not None and change.rule not in RULES:
        return f"--rule {change.rule[:40]!r}: unknown rule; one of {', '.join(RULES)}"
    if change.first is not None and change.first < 1:
        return (
            f"--from {change.first}: the first version to make with the change is 1 or later "
            "(version 0 is the run's start, no merge made it)"
        )
    return None


def _reads_alpha(rule: type[MergeRule]) -> bool:
    """The rule takes its α from the run's schedule (not a rule of its own, as average's)."""
    return rule.alpha is MergeRule.alpha


def plan_change(cfg: RunConfig, plan: ReplayPlan, change: Change) -> PlannedChange:
    """Judge an ``--alpha``/``--rule`` change against the run (``cfg``, its whole replay
    ``plan``): the new settings, where they start, and what the what-if must say (pure)."""
    problem = request_problem(change)
    if problem is not None:
        raise NotReplayable(problem)
    assert change.reject is None, "a rejection is not a change of settings"
    m = cfg.merge
    before, after = RULES[m.rule], RULES[change.rule or m.rule]
    newest = plan.last
    first = 1 if change.first is None else change.first
    if first > newest:
        raise NotReplayable(
            f"--from {first}: run {plan.run!r} has no version {first} (newest v{newest})"
        )
    update: dict[str, Any] = {}
    if change.rule is not None:
        update["rule"] = change.rule
    if change.alpha is not None:
        if not _reads_alpha(after):
            raise NotReplayable(
                f"--alpha: rule {after.name} sets its own α (the k-th result of an epoch gets "
                "k/(k+1)), it reads no merge.alpha"
            )
        update |= {"alpha": change.alpha, "schedule": "constant", "alpha_end": None, "alphas": None}
    same = all(getattr(m, k) == v for k, v in update.items())
    if same or (
        change.alpha is not None
        and m.schedule == "constant"
        and m.alpha == change.alpha
        and after is before
    ):
        raise NotReplayable(
            f"run {plan.run!r} merges with rule {m.rule} and α {m.alpha} ({m.schedule}) already: "
            "the what-if would change nothing"
        )
    carried_variable = any(t.variable_from is not None for t in plan.trainings)
    if after.worker_variable and not before.worker_variable:
        raise NotReplayable(
            f"--rule {after.name}: each attempt would start from its worker's own EASGD "
            f"variable pulled towards the head; run {plan.run!r}'s workers kept none, and the "
            "what-if cannot make up what they would have carried"
        )
    if (
        before.worker_variable
        and carried_variable
        and (change.rule is not None or change.alpha is not None)
    ):
        what = f"rule {after.name}" if after is not before else f"α {change.alpha}"
        raise NotReplayable(
            f"run {plan.run!r}'s attempts carried their worker's EASGD variable, pulled towards "
            f"the head by the recorded α before they trained: with {what} they would have "
            "trained otherwise, which the what-if cannot re-create"
        )
    if after.pins_base and not before.pins_base:
        raise NotReplayable(
            f"--rule {after.name}: it starts every attempt of an epoch from the epoch's first "
            f"version; run {plan.run!r}'s attempts started from the head of their time, so its "
            "results are not what that rule would have merged"
        )
    if first > 1 and after is not before and after.keeps_state and before.keeps_state:
        raise NotReplayable(
            f"--rule {after.name} --from {first}: rules {before.name} and {after.name} keep "
            "different states (momentum), which cannot be handed from one to the other mid-run"
        )
    notes = [
        "every attempt merged from "
        + (f"version {first}" if first > 1 else "the first merge")
        + " on was re-trained from the new run's versions (from the one that stood where its "
        "original base stood); the schedule is the original's (which version each attempt "
        "started from, the merge order), not one a run configured so would have made"
    ]
    if first > 1:
        notes.append(
            f"versions 1 to {first - 1} were re-made as recorded (the original's settings), "
            "then compared with the original's checksums"
        )
    if change.alpha is not None and m.staleness == "raise":
        notes.append(
            f"α {change.alpha} is raised for each result's staleness by the run's staleness "
            "policy (raise), as in a run configured so"
        )
    if after.keeps_state and (after is not before) and first > 1:
        notes.append(f"rule {after.name}'s state (its momentum) starts afresh at version {first}")
    return PlannedChange(update, first, before.name, after.name, notes)
