"""``easgd``: elastic averaging, asynchronous form.

Zhang, Choromanska, LeCun, NeurIPS 2015 (https://arxiv.org/abs/1412.6651):
the head moves towards the worker's variable, ``W ← W + ρ·(x_i − W)`` with
the moving rate ρ = 1 − α, and the worker's variable towards the head before
it trains again, ``x_i ← x_i − ρ·(x_i − W)``. A worker keeps its variable in
memory between attempts of a run; a new or restarted one (a spot
replacement) starts from the head, as a fresh EASGD worker does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vcdl.merge.builtin.vc_asgd import VcAsgd

if TYPE_CHECKING:
    from vcdl.types import StateDict


class Easgd(VcAsgd):
    name = "easgd"
    summary = (
        "easgd: elastic averaging, the head moves towards each worker's variable and a "
        "worker's variable towards the head by 1-a."
    )
    worker_variable = True

    def start(self, base: StateDict, own: StateDict | None, alpha: float) -> StateDict:
        import torch

        from vcdl.merge.checks import mismatch

        if own is None or mismatch(base, own, "own") is not None:
            return base  # a new or restarted worker: a fresh EASGD variable is the center
        rho = 1.0 - alpha
        with torch.no_grad():
            return {
                k: torch.lerp(own[k], b, rho) if b.is_floating_point() else b.clone()
                for k, b in base.items()
            }
