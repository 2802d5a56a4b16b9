"""What-if changes judged before anything is trained (vcdl.replay.change, pure): the
combinations refused whatever the run, and the changes refused for a given run."""

from __future__ import annotations

import math
from typing import Any

import pytest

from vcdl.config import RunConfig, parse_config
from vcdl.replay.change import Change, plan_change, request_problem
from vcdl.replay.plan import NotReplayable, ReplayPlan, Training


def cfg(**merge: Any) -> RunConfig:
    return parse_config({"run": {"name": "r"}, "merge": {"alpha": 0.5, **merge}})


def training(ident: str, variable_from: tuple[str, int | None] | None = None) -> Training:
    return Training(ident, 0, 0, 1, 0, 7, None, 0, None, None, variable_from, None, "cpu", 1)


def plan(last: int = 6, *trainings: Training) -> ReplayPlan:
    return ReplayPlan("r", 0, last, (), trainings or (training("a0"),))


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (Change(reject="ab", alpha=0.5), "does not combine"),
        (Change(reject="ab", first=3), "does not combine"),
        (Change(reject=""), "needs an attempt"),
        (Change(), "needs a change"),
        (Change(first=2), "add --alpha or --rule"),
        (Change(alpha=0.0), "(0, 1]"),
        (Change(alpha=1.5), "(0, 1]"),
        (Change(alpha=-0.1), "(0, 1]"),
        (Change(alpha=math.nan), "(0, 1]"),
        (Change(alpha=math.inf), "(0, 1]"),
        (Change(rule="nope"), "unknown rule"),
        (Change(alpha=0.5, first=0), "1 or later"),
    ],
)
def test_nonsense_is_refused_in_one_line(change: Change, words: str) -> None:
    problem = request_problem(change)
    assert problem is not None and words in problem and "\n" not in problem


@pytest.mark.parametrize(
    "change",
    [
        Change(reject="ab"),
        Change(alpha=1.0),
        Change(alpha=0.25, first=3),
        Change(rule="delta"),
        Change(rule="diloco", alpha=0.9, first=1),
    ],
)
def test_sensible_requests_pass(change: Change) -> None:
    assert request_problem(change) is None


def test_an_alpha_replaces_the_schedule_from_the_version_asked() -> None:
    run = cfg(schedule="linear", alpha_end=0.9, staleness="raise")
    p = plan_change(run, plan(), Change(alpha=0.7, first=3))
    assert p.merge == {"alpha": 0.7, "schedule": "constant", "alpha_end": None, "alphas": None}
    assert (p.first, p.rule_before, p.rule_after, p.changes_rule) == (
        3,
        "vc_asgd",
        "vc_asgd",
        False,
    )
    # It says what the what-if did and did not re-create.
    assert any("re-trained" in n and "schedule is the original's" in n for n in p.notes)
    assert any("versions 1 to 2 were re-made as recorded" in n for n in p.notes)
    assert any("staleness" in n for n in p.notes)
    # The new run's config takes the settings (validated).
    assert run.updated(merge=p.merge).merge.alpha == 0.7


def test_a_rule_change_from_a_version_on_says_its_state_starts_afresh() -> None:
    p = plan_change(cfg(), plan(), Change(rule="diloco", first=4))
    assert p.merge == {"rule": "diloco"} and p.changes_rule
    assert any("starts afresh at version 4" in n for n in p.notes)


@pytest.mark.parametrize(
    ("run", "change", "the_plan", "words"),
    [
        (cfg(), Change(alpha=0.6, first=7), plan(6), "has no version 7"),
        (cfg(), Change(alpha=0.5), plan(), "would change nothing"),
        (cfg(), Change(rule="vc_asgd"), plan(), "would change nothing"),
        (cfg(rule="average"), Change(alpha=0.7), plan(), "sets its own α"),
        (cfg(), Change(rule="average"), plan(), "first version"),
        (cfg(), Change(rule="easgd"), plan(), "kept none"),
        (
            cfg(rule="easgd"),
            Change(rule="vc_asgd"),
            plan(6, training("a0"), training("a1", ("a0", None))),
            "EASGD variable",
        ),
        (
            cfg(rule="easgd"),
            Change(alpha=0.8),
            plan(6, training("a0"), training("a1", ("a0", None))),
            "EASGD variable",
        ),
        (cfg(rule="diloco"), Change(rule="diloco_async", first=3), plan(), "different states"),
    ],
)
def test_changes_the_run_cannot_take_are_refused(
    run: RunConfig, change: Change, the_plan: ReplayPlan, words: str
) -> None:
    with pytest.raises(NotReplayable, match=words) as refused:
        plan_change(run, the_plan, change)
    assert "\n" not in str(refused.value)


def test_an_easgd_run_whose_workers_carried_nothing_may_change_rule() -> None:
    # Every attempt on a fresh worker: no variable, so nothing the rule changed in training.
    p = plan_change(cfg(rule="easgd"), plan(), Change(rule="vc_asgd"))
    assert p.rule_before == "easgd" and p.rule_after == "vc_asgd"
    # A whole-run change of diloco to diloco_async hands no state over.
    assert plan_change(cfg(rule="diloco"), plan(), Change(rule="diloco_async")).changes_rule
