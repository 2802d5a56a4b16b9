"""``diloco_async``: the asynchronous outer step with delayed Nesterov momentum.

Liu et al. 2024 (https://arxiv.org/abs/2401.09135) found that applying
DiLoCo's outer Nesterov step per result, as :mod:`.diloco` does, loses to
synchronous DiLoCo even on equal workers: every stale pseudo-gradient is
amplified by the momentum. Their delayed Nesterov update applies each
result's pseudo-gradient at once, without momentum, and lets the momentum
step once every N results on their mean (:func:`vcdl.merge.ops.delayed_nesterov`).
N is ``merge.momentum_delay``, by default the number of workers: one
momentum step per round of results, as synchronous DiLoCo takes.

The outer learning rate is (1 − α)·N·(1 − μ): a steady stream of equal
results then moves the head, once the momentum has built up, as far per
result as the delta rule with the same α does, which is how :mod:`.diloco`
is scaled too. Near-simultaneous results can also be merged as one group
(``merge.fold``), the grace window of the paper. The pending momentum (and
a count of the results merged) is the rule's persistent state, stored with
the versions like :mod:`.diloco`'s, so a resumed run continues it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from vcdl.merge.interface import STEP_KEY, Applied, MergeRule, RuleSettings, rule_buffers

if TYPE_CHECKING:
    from vcdl.types import StateDict


class DilocoAsyncSettings(RuleSettings):
    """``merge.momentum_delay``: results per step of the delayed momentum."""

    momentum_delay: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="diloco_async: results merged per step of the outer momentum (N of "
        "delayed Nesterov); empty = the number of workers.",
    )


class DilocoAsync(MergeRule):
    name = "diloco_async"
    summary = (
        "diloco_async: each result's change from its base applied at once, and the outer "
        "Nesterov momentum (outer_momentum) stepped once every momentum_delay results on "
        "their mean (Liu et al. 2024's delayed Nesterov); kept with the versions."
    )
    settings_model = DilocoAsyncSettings
    reads_base = True
    keeps_state = True
    writes_out = False

    @property
    def delay(self) -> int:
        """N: the setting, or the number of workers."""
        return self.settings.momentum_delay or self.workers

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
        from vcdl.merge.ops import delayed_nesterov

        assert base is not None, "diloco_async reads the result's base"
        reason = validate_result(base, result, self.settings.max_update_norm)
        if reason is not None:
            return reason
        pending, step = rule_buffers(head, state)
        if state is not None and pending is None:
            # Another model's state (a changed run): the momentum starts afresh, and
            # its round with it.
            step = 0
        mu = self.settings.outer_momentum
        n = self.delay
        merged, new_pending = delayed_nesterov(
            head,
            result,
            pending,
            lr=(1.0 - alpha) * n * (1.0 - mu),
            momentum=mu,
            delay=n,
            step=step,
            base=base,
        )
        new_pending[STEP_KEY] = torch.tensor(step + 1, dtype=torch.int64)
        return Applied(merged, new_pending)
