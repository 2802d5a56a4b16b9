"""A drain with no result for a while says what it waits for, down to the line.

Against a real Dask cluster: :func:`flows.epoch_stall.look_up_tasks` reads a
running task's state, worker and call stack from the scheduler and workers;
and a real run whose model factory sleeps on the workers (the user's code
beside its config) logs the report while the first attempts stall, naming
the sleeping line of the user's module.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flows.epoch_stall import look_up_tasks
from vcdl import api
from vcdl.config import parse_config
from vcdl.views.audit import audit_run

pytestmark = pytest.mark.timeout(300)


def _nap(seconds: float) -> float:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # a Python frame, seen in the call stack
        time.sleep(0.05)
    return seconds


def test_the_scheduler_and_worker_say_where_a_task_is() -> None:
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        fut = client.submit(_nap, 4.0, pure=False)
        deadline = time.monotonic() + 20
        while look_up_tasks(client, [fut.key])[fut.key].state != "processing":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(0.3)  # in _nap's loop by now
        looks = look_up_tasks(client, [fut.key, "no-such-key"])
        look = looks[fut.key]
        assert look.worker == next(iter(client.scheduler_info()["workers"]))
        assert any("_nap" in frame for frame in look.stack), look.stack
        assert looks["no-such-key"].state == "unknown to the scheduler"
    assert look_up_tasks(None, ["k"]) == {}


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def epoch_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The WARNING lines of the epoch subflows' loggers (attached as each executor is
    made: Prefect configures its loggers again when a run starts)."""
    import flows.epoch

    keep = _Keep()
    real = flows.epoch.get_run_logger
    loggers: set[logging.Logger] = set()

    def get_run_logger() -> Any:
        adapter = real()
        logger = adapter.logger if isinstance(adapter, logging.LoggerAdapter) else adapter
        if keep not in logger.handlers:
            logger.addHandler(keep)
            loggers.add(logger)
        return adapter

    monkeypatch.setattr(flows.epoch, "get_run_logger", get_run_logger)
    try:
        yield keep.lines
    finally:
        for logger in loggers:
            logger.removeHandler(keep)


SLOW_MODEL = """
import time
import torch

def make(input_shape, num_classes, hidden=16):
    try:
        from distributed import get_worker
        get_worker()
    except ValueError:
        pass  # the driver: no stall there
    else:
        time.sleep(9)  # the stall the driver's report must point at
    n = 1
    for d in input_shape:
        n *= d
    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(n, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, num_classes),
    )
"""


@pytest.mark.slow
def test_a_stalled_run_logs_what_it_waits_for(
    prefect_api: None, tmp_path: Path, epoch_log: list[str]
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "slowmodel.py").write_text(SLOW_MODEL)
    cfg = code / "job.toml"
    # attempt_timeout 30: the first report after 7.5 s without a result, before
    # the 9-s sleep (plus the worker's start) ends; no attempt times out.
    cfg.write_text(
        '[run]\nname = "stall"\nepochs = 1\nseed = 3\n'
        '[data]\nname = "mnist1d"\nsamples = 1000\nshards = 2\n'
        '[model]\nfactory = "slowmodel:make"\n'
        "[train]\nlr = 0.01\nbatch_size = 50\n"
        "[fault]\nattempt_timeout = 30\n"
        "[cluster]\nworkers = 2\n"
    )
    summary = api.train(cfg, home=tmp_path / "home")
    assert summary["state"] == "completed" and summary["head_version"] == 2
    reports = [line for line in epoch_log if line.startswith("epoch 0: no result for ")]
    assert reports, epoch_log
    first = reports[0]
    assert "epoch 0 shard 0, submission 1: Dask: processing on tcp://" in first
    assert "slowmodel.py" in first and "time.sleep(9)" in first, first[:3000]


HOOK_SLEEP = 90.0


def _stuck_after_the_body(task: object, task_run: Any, state: object) -> None:
    # A Prefect hook on the worker, after the attempt is recorded and before the
    # task returns: the first attempt of shard 0 never comes back in time.
    if "shard 0 · attempt 1" in str(task_run.name):
        time.sleep(HOOK_SLEEP)


@pytest.mark.slow
def test_a_result_whose_task_does_not_come_back_is_merged_from_the_ledger(
    prefect_api: None,
    tmp_path: Path,
    epoch_log: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import flows.epoch

    stuck = flows.epoch.train_shard.with_options(on_completion=[_stuck_after_the_body])
    monkeypatch.setattr(flows.epoch, "train_shard", stuck)
    cfg = parse_config(
        {
            "run": {"name": "stuck", "epochs": 2, "seed": 4},
            "data": {"name": "mnist1d", "samples": 1000, "shards": 2},
            "model": {"factory": "cnn1d", "kwargs": {"width": 8}},
            "train": {"lr": 0.01, "batch_size": 50},
            # The first report after 5 s without a result.
            "fault": {"attempt_timeout": 20},
            "cluster": {"workers": 2},
        }
    )
    began = time.monotonic()
    summary = api.train(cfg, home=tmp_path / "home")
    took = time.monotonic() - began
    assert summary["state"] == "completed" and summary["head_version"] == 4
    taken = "epoch 0 shard 0: its attempt is in the ledger as a result"
    assert any(line.startswith(taken) for line in epoch_log), epoch_log
    # Not waited for: the hook still sleeps when the run ends.
    assert took < HOOK_SLEEP, took
    ref = api.run_ref("stuck", home=tmp_path / "home")
    assert audit_run(ref, deep=True) == []
    merged = [a for a in ref.ledger().attempts("stuck") if a.state == "merged"]
    assert sorted((a.epoch, a.shard) for a in merged) == [(0, 0), (0, 1), (1, 0), (1, 1)]
