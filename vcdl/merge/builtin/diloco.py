"""``diloco``: the DiLoCo outer step applied per result, and the settings it owns.

Douillard et al. 2023 (https://arxiv.org/abs/2311.08105): the
pseudo-gradient ``g = W_b − W_c`` feeds an outer SGD with Nesterov momentum
μ (``merge.outer_momentum``) and learning rate (1 − α)(1 − μ): a steady
stream of results moves the head as far per result as the delta rule does
(momentum multiplies a steady step by 1/(1 − μ)), and momentum only
averages the direction over recent results; with μ = 0 it is the delta rule.
Measured here on a small MNIST-1D run: μ 0.9 with learning rate 1 − α = 0.5
(the paper's form, one outer step per result) fell back to chance by epoch
3; α 0.95 (0.05 × 10 = 0.5 per result) trained. The momentum (and a count of
the steps taken) is the rule's persistent state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from vcdl.merge.interface import STEP_KEY, Applied, MergeRule, RuleSettings, rule_buffers

if TYPE_CHECKING:
    from vcdl.types import StateDict


class DilocoSettings(RuleSettings):
    """``merge.outer_momentum`` and ``merge.nesterov``: the outer SGD's momentum."""

    outer_momentum: float = Field(
        0.9,
        ge=0,
        lt=1,
        description="diloco, diloco_async: momentum of the outer SGD (the paper's 0.9).",
    )
    nesterov: bool = Field(True, description="diloco: Nesterov momentum (the paper's choice).")


class Diloco(MergeRule):
    name = "diloco"
    summary = (
        "diloco: an outer SGD step with Nesterov momentum m (outer_momentum) and learning "
        "rate (1-a)(1-m) on each result's change from its base; the momentum is kept with "
        "the versions, so a resumed run continues it."
    )
    settings_model = DilocoSettings
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
        import torch

        from vcdl.merge.checks import validate_result
        from vcdl.merge.ops import diloco

        assert base is not None, "DiLoCo reads the result's base"
        reason = validate_result(base, result, self.settings.max_update_norm)
        if reason is not None:
            return reason
        buffers, step = rule_buffers(head, state)  # None: start the momentum afresh
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
