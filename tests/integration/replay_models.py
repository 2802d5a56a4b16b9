"""A model for replay tests: a small MLP whose process SIGKILLs itself at one forward pass.

``kill_at`` forward passes into the first attempt that builds it (no marker file
yet), it waits a moment (the background checkpoint writer records its last
checkpoint) and kills its own process: a worker lost mid-attempt, its
checkpoint left for the attempt that replaces it. Every later build, the
replay's included, finds the marker and trains as a plain MLP.
"""

from __future__ import annotations

import os
import signal
import time

import torch
from torch import nn


class KilledAt(nn.Module):
    def __init__(self, marker: str, kill_at: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(40, 32), nn.ReLU(), nn.Linear(32, 10))
        self.armed = not os.path.exists(marker)
        self.marker, self.kill_at, self.calls = marker, kill_at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.armed and self.calls == self.kill_at:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            time.sleep(1.0)  # the checkpoint being written is recorded
            os.kill(os.getpid(), signal.SIGKILL)
        out: torch.Tensor = self.net(x.reshape(len(x), -1))
        return out


def killed_at(
    input_shape: tuple[int, ...], num_classes: int, marker: str, kill_at: int = 10
) -> nn.Module:
    return KilledAt(marker, kill_at)
