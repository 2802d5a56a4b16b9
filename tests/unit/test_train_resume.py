"""vcdl.worker.loop.train_attempt's checkpoints and resumption, in memory.

With plain SGD (no momentum) the optimizer has no state, so training resumed
from a checkpoint must end exactly where the uninterrupted attempt ends: the
same batches in the same order, none twice, none skipped.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vcdl.config import TrainSection
from vcdl.data.stream import ShardStream
from vcdl.models import mlp
from vcdl.types import StateDict
from vcdl.worker.loop import train_attempt

torch.set_num_threads(1)


def data(n: int = 230) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 8)).astype(np.float32), rng.integers(0, 3, size=n)


def cfg(**kw: object) -> TrainSection:
    base = {"optimizer": "sgd", "lr": 0.1, "batch_size": 20, "local_epochs": 3}
    return TrainSection.model_validate(base | kw)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return mlp(input_shape=(8,), num_classes=3)


def initial() -> StateDict:
    return {k: v.clone() for k, v in model().state_dict().items()}


@pytest.mark.parametrize("at", [1, 5, 12, 13, 20, 35])
def test_resumed_sgd_ends_where_the_uninterrupted_attempt_ends(at: int) -> None:
    x, y = data()
    c = cfg()
    taken: list[tuple[StateDict, int, float]] = []

    def keep(state: StateDict, samples: int, seconds: float) -> None:
        taken.append(({k: v.clone() for k, v in state.items()}, samples, seconds))

    # checkpoint_seconds=0: a checkpoint after every batch (12 per local epoch).
    full = train_attempt(
        model(), initial(), {"x": x, "y": y}, c, seed=7, checkpoint=keep, checkpoint_seconds=0
    )
    assert full.samples == full.planned_samples == 230 * 3
    assert [s for _, s, _ in taken] == sorted({s for _, s, _ in taken})
    state, samples, seconds = taken[at - 1]
    assert seconds >= 0
    resumed = train_attempt(model(), state, {"x": x, "y": y}, c, seed=7, start_samples=samples)
    assert resumed.samples == full.samples and resumed.planned_samples == full.planned_samples
    for k in full.state:
        torch.testing.assert_close(resumed.state[k], full.state[k], rtol=0, atol=0)


def test_checkpoints_come_at_the_configured_interval() -> None:
    x, y = data()
    calls: list[int] = []
    train_attempt(
        model(),
        initial(),
        {"x": x, "y": y},
        cfg(),
        seed=1,
        checkpoint=lambda s, n, t: calls.append(n),
        checkpoint_seconds=3600,
    )
    assert calls == []  # none within an hour
    train_attempt(
        model(),
        initial(),
        {"x": x, "y": y},
        cfg(),
        seed=1,
        checkpoint=lambda s, n, t: calls.append(n),
    )
    assert calls == []  # no interval, no checkpoints


def test_checkpoint_time_is_not_training_time() -> None:
    x, y = data()
    import time

    slow = train_attempt(
        model(),
        initial(),
        {"x": x, "y": y},
        cfg(local_epochs=1),
        seed=1,
        checkpoint=lambda s, n, t: time.sleep(0.05),
        checkpoint_seconds=0,
    )
    # 12 checkpoints of 50 ms each would be 0.6 s of "training".
    assert slow.train_seconds < 0.3


def test_resuming_at_the_end_trains_nothing() -> None:
    x, y = data()
    out = train_attempt(model(), initial(), {"x": x, "y": y}, cfg(), seed=3, start_samples=230 * 3)
    assert out.samples == 230 * 3 and out.train_seconds < 0.05
    for k, v in initial().items():
        torch.testing.assert_close(out.state[k], v, rtol=0, atol=0)


@pytest.mark.parametrize("bad", [-1, 230 * 3 + 1])
def test_start_beyond_the_plan_is_refused(bad: int) -> None:
    x, y = data()
    with pytest.raises(ValueError, match="start_samples"):
        train_attempt(model(), initial(), {"x": x, "y": y}, cfg(), seed=3, start_samples=bad)


class _MemoryStream(ShardStream):
    """A shard streamed block by block, the blocks served from memory."""

    def __init__(self, arrays: dict[str, np.ndarray], rows_per_chunk: int) -> None:
        super().__init__({f: None for f in arrays}, np.arange(len(arrays["y"])), rows_per_chunk)  # type: ignore[misc]
        self._memory = arrays

    def read_block(self, i: int) -> dict[str, np.ndarray]:
        return {f: a[self._blocks[i]] for f, a in self._memory.items()}


@pytest.mark.parametrize("at", [1, 12, 13, 35])
def test_a_streamed_shard_resumes_where_the_uninterrupted_attempt_ends(at: int) -> None:
    x, y = data()
    stream = _MemoryStream({"x": x, "y": y}, rows_per_chunk=50)
    c = cfg()
    taken: list[tuple[StateDict, int]] = []
    full = train_attempt(
        model(),
        initial(),
        stream,
        c,
        seed=7,
        checkpoint=lambda s, n, t: taken.append(({k: v.clone() for k, v in s.items()}, n)),
        checkpoint_seconds=0,
    )
    assert full.samples == full.planned_samples == 230 * 3
    state, samples = taken[at - 1]
    resumed = train_attempt(model(), state, stream, c, seed=7, start_samples=samples)
    assert resumed.samples == full.samples
    for k in full.state:
        torch.testing.assert_close(resumed.state[k], full.state[k], rtol=0, atol=0)
