"""A drain with no result for a while says what it waits for, down to the line.

Against a real Dask cluster: :func:`flows.epoch_stall.look_up_tasks` reads a
running task's state, worker and call stack from the scheduler and workers;
and a real run whose model factory sleeps on the workers (the user's code
beside its config) logs the report while the first attempts stall, naming
the sleeping line of the user's module.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flows.epoch_stall import look_up_tasks
from vcdl import api

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
    prefect_api: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]
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
    # The flow's log, as Prefect's console handler wrote it.
    err = capfd.readouterr().err
    assert "epoch 0: no result for " in err, err[-3000:]
    first = err[err.index("epoch 0: no result for ") :]
    assert "epoch 0 shard 0, submission 1: Dask: processing on tcp://" in first
    assert "slowmodel.py" in first and "time.sleep(9)" in first, first[:3000]
