"""``delta``: ``W ← W + (1 − α)·(W_c − W_b)``, the result's own change from its base ``W_b``.

A stale result no longer pulls the head back. The arithmetic is
:mod:`vcdl.merge.delta`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vcdl.merge.interface import Applied, MergeRule

if TYPE_CHECKING:
    from vcdl.types import StateDict


class Delta(MergeRule):
    name = "delta"
    summary = (
        "delta: W <- W + (1-a)*(W_worker - W_base), the worker's own change from the version "
        "it started from (stale results no longer pull the head back)."
    )
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
        from vcdl.merge.delta import validated_delta

        assert base is not None, "the delta rule reads the result's base"
        bound = self.settings.max_update_norm
        merged = validated_delta(head, result, base, alpha, bound, out=out)
        return merged if isinstance(merged, str) else Applied(merged)
