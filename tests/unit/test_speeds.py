"""cluster.speeds: which factor a worker runs at, the pace it keeps, the config's checks,
and that every output of such a run says its speeds are emulated."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from vcdl.config import TrainSection, parse_config
from vcdl.errors import ConfigError
from vcdl.views.summary import summary_lines
from vcdl.worker.loop import train_attempt
from vcdl.worker.speed import Pacer, speed_of, speeds_label


def test_a_worker_s_speed_is_its_name_s_entry() -> None:
    speeds = [1.0, 0.5, 0.25]
    assert [speed_of(i, speeds) for i in range(4)] == [1.0, 0.5, 0.25, 1.0]
    assert speed_of("2", speeds) == 0.25  # dask worker --name 2
    assert speed_of("tcp://10.0.0.1:4000", speeds) == 1.0  # not a number: its own pace
    assert speed_of(None, speeds) == 1.0
    assert speed_of(3, []) == 1.0
    assert speeds_label([1.0, 0.125]) == "speeds emulated: 1, 0.125" and speeds_label([]) == ""


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@given(speed=st.floats(0.01, 1.0), compute=st.floats(0.0, 5.0))
def test_the_pace_stretches_a_batch_to_one_over_the_speed(speed: float, compute: float) -> None:
    t = FakeTime()
    pacer = Pacer(speed, sleep=t.sleep, clock=t.clock)
    pacer.after_batch(compute)
    assert compute + t.now == pytest.approx(compute / speed, rel=1e-9, abs=1e-9)
    assert pacer.waited == pytest.approx(t.now)
    assert all(s <= 0.2 + 1e-12 for s in t.sleeps)  # the stop signal is polled


def test_a_stop_ends_the_wait() -> None:
    t = FakeTime()
    stops = iter([False, False, True])
    pacer = Pacer(0.1, should_stop=lambda: next(stops), sleep=t.sleep, clock=t.clock)
    pacer.after_batch(10.0)  # 90 s to wait: two polls, then the notice
    assert t.now == pytest.approx(0.4) and pacer.waited == pytest.approx(0.4)


def test_full_speed_waits_nothing() -> None:
    t = FakeTime()
    pacer = Pacer(1.0, sleep=t.sleep, clock=t.clock)
    pacer.after_batch(3.0)
    assert not pacer.active and t.sleeps == [] and pacer.waited == 0.0
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        Pacer(0.0)


@pytest.mark.alone  # a ratio of timings
def test_a_slow_worker_s_attempt_is_slower_by_its_factor_and_says_so() -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "x": rng.normal(size=(256, 64)).astype(np.float32),
        "y": rng.integers(0, 4, 256).astype(np.int64),
    }
    cfg = TrainSection(batch_size=16, lr=0.01)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    base = {k: v.clone() for k, v in model.state_dict().items()}
    full = train_attempt(model, base, arrays, cfg, seed=1)
    slow = train_attempt(model, base, arrays, cfg, seed=1, speed=0.25)
    assert full.emulated_wait == 0.0
    # Waits of 3x each batch's own measured time: about 3/4 of the training time
    # (less what is not measured per batch; more what sleeps overshoot).
    assert 0.6 < slow.emulated_wait / slow.train_seconds < 0.85
    # Same batches, same arithmetic: only the clock differs.
    for k in full.state:
        assert torch.equal(full.state[k], slow.state[k])


def test_the_config_takes_one_speed_per_local_worker() -> None:
    assert parse_config({"cluster": {"workers": 3, "speeds": [1, 0.5, 0.25]}}).cluster.speeds == [
        1.0,
        0.5,
        0.25,
    ]
    with pytest.raises(ConfigError, match=r"lists 2 speed\(s\) for 3 local worker\(s\)"):
        parse_config({"cluster": {"workers": 3, "speeds": [1, 0.5]}})
    with pytest.raises(ConfigError, match=r"not a speed in \(0, 1\]"):
        parse_config({"cluster": {"speeds": [1, 2]}})
    with pytest.raises(ConfigError, match="must hold numbers"):
        parse_config({"cluster": {"speeds": [1, True]}})
    # A fleet: workers named 0, 1, ... by `dask worker --name`, however many.
    cfg = parse_config({"cluster": {"address": "tcp://127.0.0.1:8786", "speeds": [1, 0.5, 0.5]}})
    assert cfg.cluster.speeds == [1.0, 0.5, 0.5]


def test_a_summary_says_its_speeds_were_emulated() -> None:
    summary = {
        "run": "h",
        "state": "completed",
        "epochs_completed": 1,
        "epochs": 1,
        "head_version": 4,
        "test_metrics": {},
        "history": [],
        "emulated_speeds": [1.0, 0.25],
    }
    text = "\n".join(summary_lines(summary))
    assert "emulated speeds (1, 0.25)" in text
    assert "emulated" not in "\n".join(summary_lines(summary | {"emulated_speeds": []}))
