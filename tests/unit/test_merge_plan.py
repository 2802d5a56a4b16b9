"""The merge decision (vcdl/driver/merge_plan.py): pure, for one result or a fold."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vcdl.config import parse_config
from vcdl.driver.merge_plan import Candidate, MergePlan, Rejection, plan_merge
from vcdl.merge.rules import MergeRule, merge_rule


def rule(**merge: object) -> MergeRule:
    return merge_rule(parse_config({"merge": dict(merge)}).merge)


def cand(
    i: int,
    base: int,
    *,
    epoch: int = 0,
    partial: bool = False,
    samples: int | None = 100,
    planned: int | None = None,
) -> Candidate:
    return Candidate(f"{i:032x}", epoch, i, base, partial, samples, planned)


def plan(r: MergeRule, head: int, *cands: Candidate, lease: int | None = None) -> MergePlan:
    p = plan_merge(
        r,
        run="r",
        lease=lease,
        head=head,
        epochs=4,
        max_staleness=None,
        merged_in_epoch=0,
        candidates=cands,
    )
    assert isinstance(p, MergePlan)
    return p


def test_one_result() -> None:
    p = plan(rule(alpha=0.5), 7, cand(1, 5), lease=3)
    (step,) = p.steps
    assert (step.number, step.staleness, step.alpha, step.blend) == (8, 2, 0.5, 0.5)
    assert p.path == f"runs/r/versions/00000008-{f'{1:032x}'[:12]}-g3"
    assert p.attrs() == {
        "run": "r",
        "number": 8,
        "parent": 7,
        "attempt": f"{1:032x}",
        "epoch": 0,
        "shard": 1,
        "alpha": 0.5,
        "staleness": 2,
    }


def test_a_fold_plans_each_result_as_if_merged_one_at_a_time() -> None:
    r = rule(alpha=0.5, staleness="raise")
    p = plan(r, 10, cand(1, 10), cand(2, 10), cand(3, 9))
    assert [s.number for s in p.steps] == [11, 12, 13]
    assert [s.staleness for s in p.steps] == [0, 1, 3]
    alone = [
        plan(r, 10 + i, c).last.alpha for i, c in enumerate([cand(1, 10), cand(2, 10), cand(3, 9)])
    ]
    assert [s.alpha for s in p.steps] == alone
    assert p.attrs()["folded"] == [f"{1:032x}", f"{2:032x}"] and p.attrs()["parent"] == 12


def test_a_stale_result_is_a_rejection() -> None:
    r = rule(staleness="reject", max_staleness=1)
    got = plan_merge(
        r,
        run="r",
        lease=None,
        head=5,
        epochs=4,
        max_staleness=1,
        merged_in_epoch=0,
        candidates=[cand(1, 5), cand(2, 3)],
    )
    assert isinstance(got, Rejection) and got.attempt_id == f"{2:032x}" and got.staleness == 3
    assert got.reason == "stale: staleness 3 > 1"


def test_a_fold_is_of_one_epoch() -> None:
    with pytest.raises(ValueError, match="one epoch"):
        plan(rule(), 0, cand(1, 0, epoch=0), cand(2, 0, epoch=1))
    with pytest.raises(ValueError, match="at least one"):
        plan(rule(), 0)


@given(
    alpha=st.floats(0.0, 1.0),
    samples=st.integers(0, 10_000),
    planned=st.one_of(st.none(), st.integers(1, 10_000)),
)
def test_a_partial_result_counts_for_its_share(
    alpha: float, samples: int, planned: int | None
) -> None:
    full = cand(1, 0, samples=samples, planned=planned)
    part = cand(1, 0, partial=True, samples=samples, planned=planned)
    assert full.blend_alpha(alpha) == alpha
    blend = part.blend_alpha(alpha)
    share = min(1.0, samples / (planned or max(1, samples)))
    assert blend == pytest.approx(1 - (1 - alpha) * share)
    assert alpha - 1e-12 <= blend <= 1.0 + 1e-12
