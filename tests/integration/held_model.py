"""A test model whose first forward pass on a chosen fleet host holds until the test lets it go.

``held`` is a small MLP. In a Dask worker process whose environment names a
path in ``$VCDL_TEST_HOLD`` (set on one namespaced host only), its first
forward pass creates ``<path>.held`` and waits (up to ``seconds``) for
``<path>.go``: the test sees the attempt is under way, cuts the host's link,
and decides when the attempt may go on. The paths are on the host's own
/tmp; the test reaches them through ``/proc/<pid>/root``. Elsewhere (other
hosts, the driver's evaluation) it is a plain MLP.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from torch import nn

ENV = "VCDL_TEST_HOLD"
_held_here: list[bool] = []  # once per process


class Held(nn.Module):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.linear = nn.Linear(40, 10)
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        path = os.environ.get(ENV)
        if path and not _held_here and _on_worker():
            _held_here.append(True)
            Path(f"{path}.held").write_text(str(time.time()))
            deadline = time.monotonic() + self.seconds
            while not Path(f"{path}.go").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return self.linear(x.reshape(len(x), -1))


def _on_worker() -> bool:
    from distributed import get_worker

    try:
        get_worker()
    except ValueError:
        return False
    return True


def held(input_shape: tuple[int, ...], num_classes: int, seconds: float = 120.0) -> nn.Module:
    return Held(seconds)
