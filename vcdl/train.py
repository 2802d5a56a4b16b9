"""Local training of one attempt, and evaluation: plain PyTorch.

This module owns what one worker does with one shard: start from the base
weights, train a *fresh* optimizer for ``local_epochs`` passes over the shard,
and hand back the resulting state dict with its metrics. It knows nothing of
Prefect, Dask, the ledger or the store; the caller does the I/O.

Training is deterministic on CPU for a given seed (one torch generator for
the batch order, the global seed for layers such as dropout). The task is
classification with cross-entropy; labels are integer class ids.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vcdl.config import TrainSection
from vcdl.types import StateDict


@dataclass(frozen=True)
class TrainResult:
    """What one attempt produced."""

    state: StateDict
    samples: int
    """Samples processed (counting every local epoch)."""
    mean_loss: float
    train_seconds: float
    """Seconds spent in the training loop (no I/O)."""
    interrupted: bool = False
    """True when ``should_stop`` ended training early (a preemption notice)."""
    planned_samples: int = 0


def make_optimizer(params: list[nn.Parameter], cfg: TrainSection) -> torch.optim.Optimizer:
    """The attempt's local optimizer, built fresh from the run's config."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def resolve_device(device: str = "auto") -> torch.device:
    """The torch device for an attempt: CUDA if asked for (or available under auto)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device = 'cuda' but this worker has no usable CUDA device")
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def _as_tensors(
    x: np.ndarray, y: np.ndarray, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    yt = torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64))
    if device is not None and device.type != "cpu":
        xt, yt = xt.to(device), yt.to(device)
    return xt, yt


def snapshot(model: nn.Module) -> StateDict:
    """A detached CPU copy of the model's state (parameters and buffers)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def train_attempt(
    model: nn.Module,
    base: StateDict,
    x: np.ndarray,
    y: np.ndarray,
    cfg: TrainSection,
    seed: int,
    should_stop: Callable[[], bool] | None = None,
) -> TrainResult:
    """Train ``model`` from ``base`` on ``(x, y)`` and return the new state.

    ``should_stop`` is polled at every batch boundary; when it returns True the
    attempt ends there and the result says how many samples it processed.
    """
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} rows but y has {len(y)}")
    device = resolve_device(cfg.device)
    model.load_state_dict(base)
    model.to(device)
    model.train()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    xt, yt = _as_tensors(x, y, device)
    n = len(xt)
    opt = make_optimizer([p for p in model.parameters() if p.requires_grad], cfg)
    # bfloat16 autocast needs no loss scaling; on CPU it stays off (no speed-up
    # for these models and it would change the numerics of CPU runs).
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cfg.amp and device.type == "cuda")
    total_loss = 0.0
    samples = 0
    interrupted = False
    start = time.perf_counter()
    for _ in range(cfg.local_epochs):
        order = torch.randperm(n, generator=gen)
        for i in range(0, n, cfg.batch_size):
            if should_stop is not None and should_stop():
                interrupted = True
                break
            idx = order[i : i + cfg.batch_size].to(device)
            opt.zero_grad(set_to_none=True)
            with amp:
                loss = F.cross_entropy(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            total_loss += float(loss.detach()) * len(idx)
            samples += len(idx)
        if interrupted:
            break
    seconds = time.perf_counter() - start
    return TrainResult(
        state=snapshot(model),
        samples=samples,
        mean_loss=total_loss / samples if samples else float("nan"),
        train_seconds=seconds,
        interrupted=interrupted,
        planned_samples=n * cfg.local_epochs,
    )


@torch.no_grad()
def evaluate(
    model: nn.Module,
    state: StateDict,
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int = 1000,
    device_name: str = "cpu",
) -> tuple[float, float]:
    """Accuracy and mean cross-entropy of ``state`` on ``(x, y)``."""
    if len(x) == 0:
        raise ValueError("cannot evaluate on an empty split")
    device = resolve_device(device_name)
    model.load_state_dict(state)
    model.to(device)
    model.eval()
    xt, yt = _as_tensors(x, y, device)
    correct = 0
    loss = 0.0
    for i in range(0, len(xt), batch_size):
        out = model(xt[i : i + batch_size])
        target = yt[i : i + batch_size]
        loss += float(F.cross_entropy(out, target, reduction="sum"))
        correct += int((out.argmax(dim=1) == target).sum())
    return correct / len(xt), loss / len(xt)
