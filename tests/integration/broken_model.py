"""A model factory whose forward pass always fails: every attempt dies in training."""

from __future__ import annotations

import torch
from torch import nn


class Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(40, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("this model cannot train (on purpose)")


def broken(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return Broken()
