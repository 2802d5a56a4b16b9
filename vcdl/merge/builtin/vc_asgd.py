"""``vc_asgd``: ``W ← α·W + (1 − α)·W_c`` (Kijsipongse et al. 2018), as results arrive."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vcdl.merge.interface import Applied, MergeRule

if TYPE_CHECKING:
    from vcdl.types import StateDict


class VcAsgd(MergeRule):
    name = "vc_asgd"
    summary = "vc_asgd: W <- a*W + (1-a)*W_worker as results arrive."

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
        from vcdl.merge.ops import validated_vc_asgd

        merged = validated_vc_asgd(head, result, alpha, self.settings.max_update_norm, out=out)
        return merged if isinstance(merged, str) else Applied(merged)
