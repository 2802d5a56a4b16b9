"""Merge rules behind one interface, chosen by ``merge.rule``: the only place that decides.

A rule says what it needs and does its arithmetic (pure functions of tensors,
:mod:`vcdl.merge.ops` and :mod:`vcdl.merge.delta`); the assimilator
(:mod:`vcdl.driver.assimilator`) does the I/O around it. Every rule:

* says which base its attempts start from and whether its merge reads the
  result's base version (``reads_base``) or pins every attempt of an epoch
  to the epoch's first version (``pins_base``);
* computes its α for one result (:meth:`MergeRule.alpha`): the run's α
  schedule and staleness policy, unless the rule defines its own;
* applies itself (:meth:`MergeRule.apply`), validating the result, and may
  keep persistent state (``keeps_state``: DiLoCo's outer momentum), which
  the assimilator stores in the weight store like weights, beside the version
  it belongs to, so a resumed run continues it;
* may change where a worker's attempt starts (:meth:`MergeRule.start`:
  EASGD's elastic pull of the worker's own variable towards the head).

The rules, with α the weight of the head (docs/design.md §1):

``vc_asgd``
    ``W ← α·W + (1 − α)·W_c`` (Kijsipongse et al. 2018).
``delta``
    ``W ← W + (1 − α)·(W_c − W_b)``: the result's own change from its base
    ``W_b``; a stale result no longer pulls the head back.
``average``
    Every attempt of an epoch starts from the epoch's first version and the
    k-th result of the epoch gets α = k/(k+1): the head ends as the plain
    mean (the synchronous baseline, local SGD).
``easgd``
    Elastic averaging (Zhang, Choromanska, LeCun, NeurIPS 2015,
    https://arxiv.org/abs/1412.6651), asynchronous form: the head moves
    towards the worker's variable, ``W ← W + ρ·(x_i − W)`` with the moving
    rate ρ = 1 − α, and the worker's variable towards the head before it
    trains again, ``x_i ← x_i − ρ·(x_i − W)``. A worker keeps its variable in
    memory between attempts of a run; a new or restarted one (a spot
    replacement) starts from the head, as a fresh EASGD worker does.
``diloco``
    The DiLoCo outer step (Douillard et al. 2023,
    https://arxiv.org/abs/2311.08105) applied per result: the
    pseudo-gradient ``g = W_b − W_c`` feeds an outer SGD with Nesterov
    momentum μ (``merge.outer_momentum``) and learning rate (1 − α)(1 − μ):
    a steady stream of results moves the head as far per result as the
    delta rule does (momentum multiplies a steady step by 1/(1 − μ)), and
    momentum only averages the direction over recent results; with μ = 0 it
    is the delta rule. Measured here on a small MNIST-1D run: μ 0.9 with
    learning rate 1 − α = 0.5 (the paper's form, one outer step per result)
    fell back to chance by epoch 3; α 0.95 (0.05 × 10 = 0.5 per result)
    trained. The momentum (and a count of the steps taken) is the rule's
    persistent state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, NamedTuple

import torch

from vcdl.config import MergeSection
from vcdl.errors import ConfigError
from vcdl.merge.checks import mismatch, validate_result
from vcdl.merge.delta import validated_delta
from vcdl.merge.ops import diloco, validated_vc_asgd
from vcdl.merge.schedules import alpha_schedule
from vcdl.merge.staleness import staleness_alpha
from vcdl.types import StateDict

STEP_KEY = "__step__"
"""In a rule state: how many merges have updated it (an int64 scalar)."""


class Applied(NamedTuple):
    """A merge's new weights, and the rule's new state (None for rules without one)."""

    weights: StateDict
    state: StateDict | None = None


class MergeRule(ABC):
    """One way of folding a result into the head; see the module docstring."""

    name: ClassVar[str]
    reads_base: ClassVar[bool] = False
    pins_base: ClassVar[bool] = False
    keeps_state: ClassVar[bool] = False
    writes_out: ClassVar[bool] = True
    """It writes its new weights into the ``out`` buffers it is given."""
    worker_variable: ClassVar[bool] = False
    """A worker keeps its last result of the run, for :meth:`start`."""

    def __init__(self, settings: MergeSection) -> None:
        self.settings = settings

    def alpha(self, epoch: int, epochs: int, staleness: int, merged_in_epoch: int) -> float | None:
        """The head's weight for one result; None: the staleness policy rejects it."""
        m = self.settings
        alpha = alpha_schedule(
            m.schedule, epoch, epochs, m.alpha, alpha_end=m.alpha_end, alphas=m.alphas
        )
        return staleness_alpha(
            alpha,
            staleness,
            m.staleness,
            power=m.staleness_power,
            max_staleness=m.max_staleness,
            grace=m.staleness_grace,
        )

    @abstractmethod
    def apply(
        self,
        head: StateDict,
        result: StateDict,
        alpha: float,
        *,
        base: StateDict | None = None,
        state: StateDict | None = None,
        out: StateDict | None = None,
    ) -> Applied | str:
        """The merged weights (and the rule's new state), or the reason to reject the result.

        ``base``: the result's base version's weights (rules that read it);
        ``state``: the rule's state after the previous merge (None at first);
        ``out``: buffers with the head's layout that may receive the new
        weights (they share no memory with any input).
        """

    def start(self, base: StateDict, own: StateDict | None, alpha: float) -> StateDict:
        """Where a worker's attempt starts, given the head it read and its own last result."""
        return base


class VcAsgd(MergeRule):
    name = "vc_asgd"

    def apply(
        self,
        head: StateDict,
        result: StateDict,
        alpha: float,
        *,
        base: StateDict | None = None,
        state: StateDict | None = None,
        out: StateDict | None = None,
    ) -> Applied | str:
        merged = validated_vc_asgd(head, result, alpha, self.settings.max_update_norm, out=out)
        return merged if isinstance(merged, str) else Applied(merged)


class Delta(MergeRule):
    name = "delta"
    reads_base = True

    def apply(
        self,
        head: StateDict,
        result: StateDict,
        alpha: float,
        *,
        base: StateDict | None = None,
        state: StateDict | None = None,
        out: StateDict | None = None,
    ) -> Applied | str:
        assert base is not None, "the delta rule reads the result's base"
        bound = self.settings.max_update_norm
        merged = validated_delta(head, result, base, alpha, bound, out=out)
        return merged if isinstance(merged, str) else Applied(merged)


class Average(VcAsgd):
    name = "average"
    pins_base = True

    def alpha(self, epoch: int, epochs: int, staleness: int, merged_in_epoch: int) -> float | None:
        # The k-th result of an epoch (0-based) gets k/(k+1): a running mean, so
        # after all S shards the head is their plain average (every shard
        # started from the same version).
        return merged_in_epoch / (merged_in_epoch + 1)


class Easgd(VcAsgd):
    name = "easgd"
    worker_variable = True

    def start(self, base: StateDict, own: StateDict | None, alpha: float) -> StateDict:
        if own is None or mismatch(base, own, "own") is not None:
            return base  # a new or restarted worker: a fresh EASGD variable is the center
        rho = 1.0 - alpha
        with torch.no_grad():
            return {
                k: torch.lerp(own[k], b, rho) if b.is_floating_point() else b.clone()
                for k, b in base.items()
            }


class Diloco(MergeRule):
    name = "diloco"
    reads_base = True
    keeps_state = True
    writes_out = False

    def apply(
        self,
        head: StateDict,
        result: StateDict,
        alpha: float,
        *,
        base: StateDict | None = None,
        state: StateDict | None = None,
        out: StateDict | None = None,
    ) -> Applied | str:
        assert base is not None, "DiLoCo reads the result's base"
        reason = validate_result(base, result, self.settings.max_update_norm)
        if reason is not None:
            return reason
        buffers = None if state is None else {k: v for k, v in state.items() if k != STEP_KEY}
        step = 0 if state is None or STEP_KEY not in state else int(state[STEP_KEY])
        if buffers is not None and set(buffers) != {
            k for k, t in head.items() if t.is_floating_point()
        }:
            buffers = None  # another model's state (a changed run): start the momentum afresh
        merged, momentum = diloco(
            head,
            result,
            buffers,
            lr=(1.0 - alpha) * (1.0 - self.settings.outer_momentum),
            momentum=self.settings.outer_momentum,
            nesterov=self.settings.nesterov,
            base=base,
        )
        momentum[STEP_KEY] = torch.tensor(step + 1, dtype=torch.int64)
        return Applied(merged, momentum)


RULES: dict[str, type[MergeRule]] = {r.name: r for r in (VcAsgd, Delta, Average, Easgd, Diloco)}
"""Every rule by its ``merge.rule`` name."""


def merge_rule(settings: MergeSection) -> MergeRule:
    """The rule a run's ``merge`` settings select."""
    try:
        return RULES[settings.rule](settings)
    except KeyError:
        raise ConfigError(
            f"unknown merge.rule {settings.rule!r}; one of {', '.join(sorted(RULES))}"
        ) from None
