"""vcdl.merge.rules: every merge.rule a config accepts is a rule, and each does its arithmetic."""

from __future__ import annotations

import typing

import pytest
import torch

from vcdl.config import MergeSection, parse_config
from vcdl.driver.head_cache import HeadCache
from vcdl.merge import vc_asgd
from vcdl.merge.delta import delta
from vcdl.merge.rules import RULES, STEP_KEY, Applied, MergeRule, merge_rule
from vcdl.types import StateDict


def state(value: float, n: int = 4) -> StateDict:
    return {"w": torch.full((n,), value), "b": torch.full((2,), value), "t": torch.tensor(3)}


def settings(**kw: object) -> MergeSection:
    return parse_config({"merge": kw}).merge


def applied(out: Applied | str) -> Applied:
    assert not isinstance(out, str), out
    return out


def test_every_rule_the_config_accepts_exists_and_none_other() -> None:
    accepted = set(typing.get_args(MergeSection.model_fields["rule"].annotation))
    assert accepted == set(RULES)
    for name in accepted:
        rule = merge_rule(settings(rule=name))
        assert isinstance(rule, MergeRule) and rule.name == name


@pytest.mark.parametrize("name", ["vc_asgd", "easgd"])
def test_vc_asgd_and_easgd_move_the_head_towards_the_result(name: str) -> None:
    rule = merge_rule(settings(rule=name, alpha=0.25))
    out = applied(rule.apply(state(0.0), state(4.0), 0.25))
    torch.testing.assert_close(out.weights["w"], torch.full((4,), 3.0))
    assert out.state is None and int(out.weights["t"]) == 3


def test_delta_adds_the_result_s_own_change() -> None:
    rule = merge_rule(settings(rule="delta"))
    out = applied(rule.apply(state(10.0), state(3.0), 0.5, base=state(1.0)))
    torch.testing.assert_close(out.weights["w"], torch.full((4,), 11.0))


def test_average_gives_the_k_th_result_weight_one_over_k_plus_one() -> None:
    rule = merge_rule(settings(rule="average"))
    alphas = [rule.alpha(0, 3, staleness=9, merged_in_epoch=k) for k in range(4)]
    assert alphas == [0.0, 0.5, 2 / 3, 0.75]  # staleness plays no part


def test_the_schedule_and_staleness_policy_give_alpha() -> None:
    rule = merge_rule(settings(rule="vc_asgd", alpha=0.5, staleness="reject", max_staleness=2))
    assert rule.alpha(0, 3, staleness=2, merged_in_epoch=0) == 0.5
    assert rule.alpha(0, 3, staleness=3, merged_in_epoch=0) is None


def test_easgd_pulls_the_worker_s_own_variable_towards_the_head() -> None:
    rule = merge_rule(settings(rule="easgd", alpha=0.75))
    head, own = state(4.0), state(0.0)
    start = rule.start(head, own, alpha=0.75)
    torch.testing.assert_close(start["w"], torch.full((4,), 1.0))  # own + 0.25 (head - own)
    assert rule.start(head, None, 0.75) is head  # a new worker starts from the center
    assert rule.start(head, state(0.0, n=3), 0.75) is head  # another model's variable
    assert merge_rule(settings(rule="vc_asgd")).start(head, own, 0.75) is head


def test_diloco_without_momentum_is_the_delta_rule_and_counts_its_steps() -> None:
    rule = merge_rule(settings(rule="diloco", outer_momentum=0.0))
    head, result, base = state(10.0), state(3.0), state(1.0)
    out = applied(rule.apply(head, result, 0.5, base=base))
    expected = delta(head, result, base, 0.5)
    torch.testing.assert_close(out.weights["w"], expected["w"])
    assert out.state is not None and int(out.state[STEP_KEY]) == 1
    again = applied(rule.apply(out.weights, result, 0.5, base=base, state=out.state))
    assert again.state is not None and int(again.state[STEP_KEY]) == 2


def test_diloco_momentum_carries_the_previous_step() -> None:
    rule = merge_rule(settings(rule="diloco", outer_momentum=0.5, nesterov=False))
    head, base = state(0.0), state(0.0)
    # Learning rate (1 - alpha)(1 - momentum) = 0.5; g = 1, buf = 1.
    first = applied(rule.apply(head, state(-1.0), 0.0, base=base))
    torch.testing.assert_close(first.weights["w"], torch.full((4,), -0.5))
    second = applied(
        rule.apply(first.weights, state(-2.0), 0.0, base=first.weights, state=first.state)
    )
    # g = -0.5 - (-2) = 1.5; buf = 0.5 * 1 + 1.5 = 2; head -0.5 - 0.5 * 2.
    torch.testing.assert_close(second.weights["w"], torch.full((4,), -1.5))


def test_diloco_rejects_a_broken_result_against_its_base() -> None:
    rule = merge_rule(settings(rule="diloco", max_update_norm=1.0))
    reason = rule.apply(state(0.0), state(5.0), 0.5, base=state(0.0))
    assert isinstance(reason, str) and "exceeds max_update_norm" in reason
    bad = state(0.0)
    bad["w"][0] = float("nan")
    assert "NaN" in str(rule.apply(state(0.0), bad, 0.5, base=state(0.0)))


def test_the_head_cache_keeps_its_spare_for_rules_that_do_not_write_into_it() -> None:
    cache = HeadCache()
    v1, v2 = state(1.0), state(2.0)
    cache.put(1, v1, owned=True)
    cache.put(2, v2, owned=True)  # v1 is the spare now
    diloco = merge_rule(settings(rule="diloco"))
    out = applied(cache.merge(diloco, v2, state(3.0), 0.5, base=v2))
    assert out.weights["w"].data_ptr() != v1["w"].data_ptr()
    vc = merge_rule(settings(rule="vc_asgd"))
    reused = applied(cache.merge(vc, v2, state(3.0), 0.5))
    assert reused.weights["w"].data_ptr() == v1["w"].data_ptr()  # the spare, kept for it
    torch.testing.assert_close(reused.weights["w"], vc_asgd(v2, state(3.0), 0.5)["w"])
