"""Model factories that misbehave on purpose: one always fails, one hangs once, one kills
its worker once, one gives its worker a preemption notice once."""

from __future__ import annotations

import os
import signal
import time

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


class HangsOnce(nn.Module):
    """A small MLP whose first forward pass anywhere (one marker file) sleeps ``seconds``."""

    def __init__(self, marker: str, seconds: float) -> None:
        super().__init__()
        self.linear = nn.Linear(40, 10)
        self.marker, self.seconds = marker, seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass
        else:
            time.sleep(self.seconds)  # the hung attempt: its worker stays up
        return self.linear(x.reshape(len(x), -1))


def hangs_once(
    input_shape: tuple[int, ...], num_classes: int, marker: str, seconds: float
) -> nn.Module:
    return HangsOnce(marker, seconds)


class SignalsOnce(nn.Module):
    """A small MLP whose first forward pass on a Dask worker (one marker file) sends its
    worker's process ``signum``: SIGKILL is a worker lost mid-attempt without notice (a
    reclaimed spot VM); SIGTERM a preemption notice mid-attempt, after which the attempt
    stops at its batch boundary with a partial result and the tasks already queued on
    that worker hand their shards back untrained."""

    def __init__(self, marker: str, signum: int) -> None:
        super().__init__()
        self.linear = nn.Linear(40, 10)
        self.marker = marker
        self.signum = signum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from distributed import get_worker

        try:
            get_worker()  # never the driver's process (an evaluation there)
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
        except (ValueError, FileExistsError):
            pass
        else:
            os.kill(os.getpid(), self.signum)
            if self.signum == signal.SIGTERM:
                _await_notice()
        return self.linear(x.reshape(len(x), -1))


def _await_notice(timeout: float = 30.0) -> None:
    """Return once this worker's runtime holds the notice SIGTERM gave it.

    The handler runs in the worker's main thread, this forward pass in a task
    thread: a shard of a few tiny batches can end before the handler ran, and
    the attempt would end whole instead of stopping at its next batch.
    """
    from vcdl.worker.runtime import current_runtime

    runtime = current_runtime()
    deadline = time.monotonic() + timeout
    while runtime is not None and not runtime.notice_received():
        if time.monotonic() > deadline:
            raise AssertionError(f"no preemption notice {timeout:.0f} s after SIGTERM")
        time.sleep(0.01)


def dies_once(input_shape: tuple[int, ...], num_classes: int, marker: str) -> nn.Module:
    return SignalsOnce(marker, signal.SIGKILL)


def noticed_once(input_shape: tuple[int, ...], num_classes: int, marker: str) -> nn.Module:
    return SignalsOnce(marker, signal.SIGTERM)
