"""CheckpointWriter: checkpoints written in the background, newest first, never raising."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from vcdl.types import StateDict
from vcdl.worker.checkpoints import CheckpointWriter, checkpoint_interval

pytestmark = [pytest.mark.timeout(30), pytest.mark.alone]


def state(v: float) -> StateDict:
    return {"w": torch.full((2,), v)}


class SlowStore:
    """Records what was written; each write waits until released."""

    def __init__(self) -> None:
        self.written: list[int] = []
        self.release = threading.Event()
        self.started = threading.Event()

    def write(self, s: StateDict, samples: int, seconds: float) -> None:
        self.started.set()
        assert self.release.wait(10)
        self.written.append(samples)


def test_handing_over_does_not_wait_for_the_write_and_only_the_newest_waits() -> None:
    store = SlowStore()
    writer = CheckpointWriter(store.write)
    t = time.perf_counter()
    writer(state(1), 100, 1.0)
    assert store.started.wait(5)  # the first write is in flight, blocked
    writer(state(2), 200, 2.0)
    writer(state(3), 300, 3.0)  # replaces 200, which never started
    assert time.perf_counter() - t < 1.0  # training went on
    store.release.set()
    assert writer.flush(5)
    assert store.written == [100, 300]
    assert (writer.written, writer.superseded, writer.failed) == (2, 1, 0)
    writer.close()


def test_close_drops_the_waiting_checkpoint_and_waits_for_the_one_in_flight() -> None:
    store = SlowStore()
    writer = CheckpointWriter(store.write)
    writer(state(1), 100, 1.0)
    assert store.started.wait(5)
    writer(state(2), 200, 2.0)
    threading.Timer(0.2, store.release.set).start()
    waited = writer.close()
    assert waited >= 0.1  # it waited for the write in flight
    assert store.written == [100]  # 200 was dropped: a result supersedes it
    writer(state(3), 300, 3.0)  # after close: ignored
    assert store.written == [100] and writer.superseded == 1


def test_a_failed_write_is_counted_and_the_next_one_still_happens(
    caplog: pytest.LogCaptureFixture,
) -> None:
    written: list[int] = []

    def write(s: StateDict, samples: int, seconds: float) -> None:
        if samples == 100:
            raise OSError("store unreachable")
        written.append(samples)

    writer = CheckpointWriter(write)
    writer(state(1), 100, 1.0)
    assert writer.flush(5)
    writer(state(2), 200, 2.0)
    assert writer.flush(5)
    writer.close()
    assert written == [200]
    assert (writer.written, writer.failed) == (1, 1)
    assert "checkpoint at 100 samples not written" in caplog.text


def test_close_without_any_checkpoint_returns_at_once() -> None:
    writer = CheckpointWriter(lambda s, n, t: None)
    assert writer.close() < 0.1
    assert writer.flush(0.1)


# --- how often: sized to the model's write time ---------------------------------------


@given(
    floor=st.floats(0.001, 1e4),
    last=st.one_of(st.none(), st.floats(0.0, 1e4)),
    ratio=st.floats(1.0, 1000.0),
)
def test_the_interval_is_the_floor_or_ratio_times_the_last_write(
    floor: float, last: float | None, ratio: float
) -> None:
    every = checkpoint_interval(floor, last, ratio)
    assert every >= floor
    if last is not None:
        assert every >= ratio * last
        # never longer than it must be
        assert every == max(floor, ratio * last) or last == 0
    else:
        assert every == floor


def test_a_slow_write_stretches_the_interval_of_the_next_checkpoints() -> None:
    written: list[float] = []

    def write(s: StateDict, samples: int, seconds: float) -> None:
        time.sleep(0.05)
        written.append(seconds)

    writer = CheckpointWriter(write)
    assert writer.interval(0.01, 10.0) == 0.01  # nothing written yet: the floor
    writer(state(1), 10, 0.0)
    assert writer.flush(5)
    assert writer.last_write_seconds is not None and writer.last_write_seconds >= 0.05
    assert writer.interval(0.01, 10.0) >= 0.5  # 10 x the write, not the floor
    writer.close()


def test_training_checkpoints_less_often_when_writes_are_slow() -> None:
    """train_attempt asks for the interval again after each checkpoint."""
    from vcdl.config import parse_config
    from vcdl.worker.loop import snapshot, train_attempt

    cfg = parse_config({"train": {"batch_size": 1, "local_epochs": 1}}).train
    model = torch.nn.Linear(4, 2)
    arrays = {"x": torch.randn(400, 4).numpy(), "y": torch.randint(0, 2, (400,)).numpy()}

    def run(intervals: list[float]) -> int:
        calls = 0

        def checkpoint(s: StateDict, samples: int, seconds: float) -> None:
            nonlocal calls
            calls += 1

        left = iter(intervals)
        train_attempt(
            model,
            snapshot(model),
            arrays,
            cfg,
            seed=0,
            checkpoint=checkpoint,
            checkpoint_seconds=lambda: next(left, 1e9),
        )
        return calls

    assert run([0.0] * 1000) == 400  # due at every batch
    assert run([0.0, 1e9]) == 1  # the first write made the next one far away
