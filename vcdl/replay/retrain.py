"""One attempt trained again on this machine's CPU, as its worker trained it.

The worker's own code does the training (:func:`vcdl.worker.shard_data.load_shard`
for the shard's rows and a fresh model, :func:`vcdl.worker.loop.train_attempt`
for the loop), from the start the plan gives (a version, a checkpoint
re-made, EASGD's variable pulled towards the base), with the recorded seed,
threads and carried optimizer state, on the CPU with PyTorch's deterministic
algorithms. :func:`stop_at` ends it where the original ended (a preemption
notice's partial result, a checkpoint a later attempt resumed): at the batch
boundary after which the recorded number of samples had been trained.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from vcdl.config import RunConfig
from vcdl.data.stream import ShardStream
from vcdl.merge.rules import rule_of
from vcdl.replay.plan import NotReplayable, Training
from vcdl.runtime import RunRef
from vcdl.types import StateDict
from vcdl.worker.loop import TrainResult, train_attempt
from vcdl.worker.shard_data import load_shard


def batch_ends(n: int, local_epochs: int, batch_size: int, start: int = 0) -> list[int]:
    """The samples trained (a resumed checkpoint's included) after each batch of an attempt.

    The training loop's batches: per local epoch, ``batch_size`` rows at a time
    from what a resumed checkpoint had seen of it, the epoch's last batch the rest.
    """
    ends: list[int] = []
    for epoch in range(local_epochs):
        pos = epoch * n + min(n, max(0, start - epoch * n))
        while pos < (epoch + 1) * n:
            pos = min(pos + batch_size, (epoch + 1) * n)
            ends.append(pos)
    return ends


def stop_at(
    target: int, n: int, local_epochs: int, batch_size: int, start: int = 0
) -> Callable[[], bool] | None:
    """A ``should_stop`` that ends training once ``target`` samples are trained; None if the
    plan's end is the target. It is asked once before each batch, in order."""
    ends = batch_ends(n, local_epochs, batch_size, start)
    if target >= (ends[-1] if ends else start):
        return None
    if target != start and target not in ends:
        raise NotReplayable(f"{target} samples is not at a batch boundary of the attempt's plan")
    before = [start, *ends]  # the samples trained before the k-th batch
    calls = iter(before)

    def should_stop() -> bool:
        return next(calls, target) >= target

    return should_stop


@contextlib.contextmanager
def deterministic(threads: int) -> Iterator[None]:
    """PyTorch's deterministic algorithms and the worker's thread count, restored after."""
    was_det = torch.are_deterministic_algorithms_enabled()
    was_threads = torch.get_num_threads()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was_det)
        torch.set_num_threads(was_threads)


def retrain(
    ref: RunRef,
    cfg: RunConfig,
    t: Training,
    *,
    base: StateDict,
    checkpoint: StateDict | None,
    optimizer_state: dict[str, Any] | None,
    variable: StateDict | None,
    samples: int,
) -> TrainResult:
    """Train attempt ``t`` again up to ``samples``: from ``checkpoint`` when it resumed one,
    else from ``base`` (its base version; EASGD pulls ``variable`` towards it)."""
    data = load_shard(ref, t.epoch, t.shard, cfg)
    arrays = data.arrays
    if isinstance(arrays, ShardStream):
        n = arrays.rows
    else:
        fields = data.objective.fields or tuple(arrays)
        n = len(arrays[fields[0]])
    start = base
    if checkpoint is not None:
        start = checkpoint
    elif rule_of(cfg).worker_variable:
        start = rule_of(cfg).start(base, variable, t.variable_alpha or 0.0)
    train_cfg = cfg.train.model_copy(update={"device": "cpu"})
    with deterministic(t.threads):
        return train_attempt(
            data.model,
            start,
            arrays,
            train_cfg,
            seed=t.seed,
            objective=data.objective,
            should_stop=stop_at(
                samples, n, cfg.train.local_epochs, cfg.train.batch_size, t.start_samples
            ),
            start_samples=t.start_samples,
            optimizer_state=optimizer_state,
        )
