"""Local training of one attempt, and evaluation: plain PyTorch.

This module owns what one worker does with one shard: start from the base
weights, train an optimizer (fresh, or carried from the worker's previous
attempt) for ``local_epochs`` passes over the shard, and hand back the
resulting state dict with its metrics. It knows nothing of
Prefect, Dask, the ledger or the store; the caller does the I/O.

Training is deterministic on CPU for a given seed (one torch generator for
the batch order, the global seed for layers such as dropout). What is
trained for is the run's objective (:mod:`vcdl.objectives`): its batches,
its loss, its metrics.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from vcdl.config import TrainSection
from vcdl.data.stream import ShardStream
from vcdl.objectives import Objective, objective_for, to_batch
from vcdl.types import StateDict
from vcdl.worker.speed import Pacer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainResult:
    """What one attempt produced."""

    state: StateDict
    samples: int
    """Samples the state has seen of the plan (every local epoch; a resumed checkpoint's too)."""
    mean_loss: float
    train_seconds: float
    """Seconds spent in this call's training loop (no I/O, no checkpoint writes)."""
    interrupted: bool = False
    """True when ``should_stop`` ended training early (a preemption notice)."""
    planned_samples: int = 0
    optimizer_state: dict[str, Any] | None = None
    """The optimizer's state at the end (``Optimizer.state_dict()``), for the next attempt."""
    emulated_wait: float = 0.0
    """Seconds of ``train_seconds`` that were an emulated speed's waits (vcdl.worker.speed)."""


def make_optimizer(params: list[nn.Parameter], cfg: TrainSection) -> torch.optim.Optimizer:
    """The attempt's local optimizer, built fresh from the run's config."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def carry(opt: torch.optim.Optimizer, state: dict[str, Any]) -> bool:
    """Load an earlier attempt's optimizer ``state`` into ``opt``; False if it does not fit.

    The hyperparameters stay ``opt``'s own (this run's config): only the
    per-parameter state (moments, step counts, momentum buffers) carries over.
    """
    try:
        groups = [dict(g) for g in state["param_groups"]]
        own = opt.state_dict()["param_groups"]
        if len(groups) != len(own) or any(
            len(g["params"]) != len(o["params"]) for g, o in zip(groups, own, strict=True)
        ):
            return False
        params = [p for group in opt.param_groups for p in group["params"]]
        for index, per_param in state["state"].items():
            for value in per_param.values():
                # Loading checks only the counts; a shape mismatch would fail at step().
                if torch.is_tensor(value) and value.dim() and value.shape != params[index].shape:
                    return False
        for g, o in zip(groups, own, strict=True):
            g.update({k: v for k, v in o.items() if k != "params"})
        opt.load_state_dict({"state": state["state"], "param_groups": groups})
    except (KeyError, IndexError, ValueError, RuntimeError, TypeError):
        return False
    return True


def resolve_device(device: str = "auto") -> torch.device:
    """The torch device for an attempt: CUDA if asked for (or available under auto)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device = 'cuda' but this worker has no usable CUDA device")
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def snapshot(model: nn.Module) -> StateDict:
    """A detached CPU copy of the model's state (parameters and buffers)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


Checkpoint = Callable[[StateDict, int, float], None]
"""Called at a batch boundary with (state, samples seen, training seconds so far)."""


def train_attempt(
    model: nn.Module,
    base: StateDict,
    arrays: Mapping[str, np.ndarray] | ShardStream,
    cfg: TrainSection,
    seed: int,
    should_stop: Callable[[], bool] | None = None,
    *,
    objective: Objective | None = None,
    start_samples: int = 0,
    checkpoint: Checkpoint | None = None,
    checkpoint_seconds: float | Callable[[], float] | None = None,
    optimizer_state: dict[str, Any] | None = None,
    speed: float = 1.0,
) -> TrainResult:
    """Train ``model`` from ``base`` on the shard's ``arrays`` and return the new state.

    ``arrays`` are the shard's rows by field, in their stored dtypes, or a
    :class:`~vcdl.data.stream.ShardStream` read block by block (a split too
    large for the worker's cache: the shard is never held whole); the
    ``objective`` (default: the run's, ``cfg.objective``) forms each batch
    from them and gives the loss.

    ``should_stop`` is polled at every batch boundary; when it returns True the
    attempt ends there and the result says how many samples it processed.

    ``checkpoint`` is called every ``checkpoint_seconds`` of training, at a
    batch boundary; the time it takes is not training time. A callable
    ``checkpoint_seconds`` is asked again after every checkpoint (the
    interval sized to the last write,
    :func:`vcdl.worker.checkpoints.checkpoint_interval`). ``start_samples``
    resumes from such a checkpoint (``base``): the batch order is the one an
    uninterrupted attempt with this seed has, the batches the checkpoint had
    seen (counting every local epoch) are skipped, and the result's
    ``samples`` count them too.

    ``optimizer_state`` (an earlier attempt's ``TrainResult.optimizer_state``)
    starts the optimizer from that state instead of fresh; one that does not
    fit this model and optimizer is ignored.

    ``speed`` below 1 emulates a slower worker (``cluster.speeds``): each
    batch is followed by a wait that stretches it to ``1/speed`` of its
    measured time (:class:`vcdl.worker.speed.Pacer`); the waits count as
    training time and, apart, as ``emulated_wait``.
    """
    objective = objective if objective is not None else objective_for(cfg)
    if isinstance(arrays, ShardStream):
        fields = objective.fields or arrays.fields
        n = arrays.rows
    else:
        fields = objective.fields or tuple(arrays)
        rows = {len(arrays[f]) for f in fields}
        if len(rows) != 1:
            sizes = ", ".join(f"{f} {len(arrays[f])}" for f in fields)
            raise ValueError(f"the shard's arrays differ in rows ({sizes})")
        n = rows.pop()
    planned = n * cfg.local_epochs
    if not 0 <= start_samples <= planned:
        raise ValueError(f"start_samples {start_samples} is outside [0, {planned}]")
    device = resolve_device(cfg.device)
    model.load_state_dict(base)
    model.to(device)
    model.train()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    data = (
        None
        if isinstance(arrays, ShardStream)
        else to_batch({f: arrays[f] for f in fields}, device)
    )
    opt = make_optimizer([p for p in model.parameters() if p.requires_grad], cfg)
    if optimizer_state is not None and not carry(opt, optimizer_state):
        # Said, not silent: train.optimizer_state = "worker" doing nothing
        # (after a model or optimizer change) would otherwise go unnoticed.
        log.warning(
            "the optimizer state kept from this worker's last attempt does not fit "
            "this model and optimizer (%s); this attempt starts a fresh one",
            cfg.optimizer,
        )
    # bfloat16 autocast needs no loss scaling; on CPU it stays off (no speed-up
    # for these models and it would change the numerics of CPU runs).
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cfg.amp and device.type == "cuda")
    # Summed on the device: a float() per step would wait for the GPU at every step.
    total_loss = torch.zeros((), device=device)
    trained = 0
    interrupted = False
    start = time.perf_counter()
    paused = 0.0  # seconds inside checkpoint(): I/O, not training
    last_checkpoint = start
    every = checkpoint_seconds() if callable(checkpoint_seconds) else checkpoint_seconds
    pacer = Pacer(speed, should_stop)
    sync = pacer.active and device.type == "cuda"  # a batch's time is the GPU's, not the queue's
    for epoch in range(cfg.local_epochs):
        seen = min(n, max(0, start_samples - epoch * n))
        # The order is drawn for every local epoch, skipped or not: the same
        # order as an attempt that was never interrupted.
        if isinstance(arrays, ShardStream):
            block_order = torch.randperm(len(arrays.sizes), generator=gen).tolist()
            batches = _streamed_batches(
                arrays, fields, block_order, seed, epoch, seen, cfg.batch_size, device
            )
        else:
            assert data is not None
            # On the device once per epoch: slicing it there needs no copy per step.
            order = torch.randperm(n, generator=gen).to(device)
            batches = _batches(data, order, seen, cfg.batch_size)
        with contextlib.closing(batches):
            for raw in batches:
                if should_stop is not None and should_stop():
                    interrupted = True
                    break
                size = len(next(iter(raw.values())))
                began = time.perf_counter()
                batch = objective.prepare(raw)
                opt.zero_grad(set_to_none=True)
                with amp:
                    loss = objective.loss(model, batch)
                loss.backward()
                opt.step()
                total_loss += loss.detach().float() * size
                trained += size
                if pacer.active:
                    if sync:
                        torch.cuda.synchronize(device)
                    pacer.after_batch(time.perf_counter() - began)
                now = time.perf_counter()
                if checkpoint is not None and every is not None and now - last_checkpoint >= every:
                    checkpoint(snapshot(model), start_samples + trained, now - start - paused)
                    last_checkpoint = time.perf_counter()
                    paused += last_checkpoint - now
                    if callable(checkpoint_seconds):
                        every = checkpoint_seconds()
        if interrupted:
            break
    if device.type == "cuda":
        # The host runs ahead of the GPU by up to a queue of kernels; without
        # this wait an attempt of a second or two counted only what was queued.
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start - paused
    return TrainResult(
        state=snapshot(model),
        samples=start_samples + trained,
        mean_loss=float(total_loss) / trained if trained else float("nan"),
        train_seconds=seconds,
        interrupted=interrupted,
        planned_samples=planned,
        optimizer_state=opt.state_dict(),
        emulated_wait=pacer.waited,
    )


def _batches(
    data: Mapping[str, torch.Tensor], order: torch.Tensor, seen: int, batch_size: int
) -> Generator[dict[str, torch.Tensor], None, None]:
    """One local epoch's batches of an in-memory shard, in ``order``, after ``seen`` samples."""
    for i in range(seen, len(order), batch_size):
        idx = order[i : i + batch_size]
        yield {f: t[idx] for f, t in data.items()}


def _streamed_batches(
    stream: ShardStream,
    fields: tuple[str, ...],
    block_order: list[int],
    seed: int,
    local_epoch: int,
    seen: int,
    batch_size: int,
    device: torch.device,
) -> Generator[dict[str, torch.Tensor], None, None]:
    """One local epoch's batches of a streamed shard, after ``seen`` samples.

    Blocks come in ``block_order``, each block's rows in an order seeded by
    (seed, local epoch, block), so a resumed attempt sees the batches an
    uninterrupted one would; batches run across block boundaries. Blocks
    wholly seen are not read.
    """
    sizes = stream.sizes
    k, pos = 0, 0
    while k < len(block_order) and pos + sizes[block_order[k]] <= seen:
        pos += sizes[block_order[k]]
        k += 1
    skip = seen - pos
    carry: dict[str, torch.Tensor] | None = None
    blocks = stream.blocks(block_order[k:])
    with contextlib.closing(blocks):
        for b, block in zip(block_order[k:], blocks, strict=True):
            rows = np.random.default_rng([seed, local_epoch, b]).permutation(sizes[b])[skip:]
            skip = 0
            got = to_batch({f: block[f][rows] for f in fields}, device)
            if carry is not None:
                got = {f: torch.cat([carry[f], got[f]]) for f in fields}
            m, i = len(got[fields[0]]), 0
            while m - i >= batch_size:
                yield {f: t[i : i + batch_size] for f, t in got.items()}
                i += batch_size
            carry = {f: t[i:] for f, t in got.items()} if i < m else None
    if carry is not None:
        yield carry


@torch.no_grad()
def evaluate(
    model: nn.Module,
    state: StateDict,
    arrays: Mapping[str, np.ndarray],
    objective: Objective,
    batch_size: int = 1000,
    device_name: str = "cpu",
) -> dict[str, float]:
    """The objective's metrics of ``state`` on ``arrays`` (``loss`` always; see vcdl.objectives)."""
    fields = objective.fields or tuple(arrays)
    n = len(arrays[fields[0]])
    if n == 0:
        raise ValueError("cannot evaluate on an empty split")
    device = resolve_device(device_name)
    model.load_state_dict(state)
    model.to(device)
    model.eval()
    data = to_batch({f: arrays[f] for f in fields}, device)
    totals: dict[str, torch.Tensor] = {}
    for i in range(0, n, batch_size):
        batch = objective.prepare({f: t[i : i + batch_size] for f, t in data.items()})
        for k, v in objective.measure(model, batch).items():
            v = v.to(device=device, dtype=torch.float64)
            totals[k] = totals[k] + v if k in totals else v
    return objective.finish({k: float(v) for k, v in totals.items()})
