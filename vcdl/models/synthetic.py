"""A model and an objective whose training is a sleep: to measure a fleet, not to learn.

``benchmarks/fleet.py`` drives tens of workers from one small machine: a real
attempt of a 25M-parameter model for 30 s would need as many cores as
workers. These stand in for the training only; everything around it is the
real thing (the shard task, the base read, the result write, the ledger,
the streamed merge).

* :func:`sleeper` — ``params`` parameters (float32, in tensors of at most
  16M elements), all zeros until the base is loaded;
* :func:`sleep_loss` — an objective: in training it sleeps the model's
  ``seconds``, then returns a loss whose gradient is the same constant for
  every weight, so that each attempt moves its base by a deterministic step
  (SGD: ``w − lr · 1e-3``). In evaluation it does not sleep.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

MAX_TENSOR = 1 << 24


class Sleeper(nn.Module):
    """``params`` float32 parameters, and how long one attempt's training takes."""

    def __init__(self, params: int, seconds: float) -> None:
        super().__init__()
        if params < 1:
            raise ValueError(f"sleeper: params must be >= 1, got {params}")
        if not seconds >= 0:
            raise ValueError(f"sleeper: seconds must be >= 0, got {seconds}")
        sizes = [MAX_TENSOR] * (params // MAX_TENSOR)
        if params % MAX_TENSOR:
            sizes.append(params % MAX_TENSOR)
        self.weights = nn.ParameterList(nn.Parameter(torch.zeros(n)) for n in sizes)
        self.seconds = float(seconds)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def sleeper(params: int = 1_000_000, seconds: float = 1.0, **_hints: Any) -> nn.Module:
    """The model factory (``model.kwargs``: ``params``, ``seconds``)."""
    return Sleeper(int(params), float(seconds))


def sleep_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sleep for the attempt's training time, then a loss with a constant gradient."""
    assert isinstance(model, Sleeper)
    if model.training and model.seconds > 0:
        time.sleep(model.seconds)
    # d(loss)/dw = 1e-3 for every weight: a deterministic step from the base.
    return sum((w.sum() * 1e-3 for w in model.weights), torch.zeros(()))
