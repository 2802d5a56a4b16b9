"""A finished task whose output Dask cannot hand over: the driver reads the ledger.

When the worker holding a finished task's output leaves before the driver
fetches it, Dask re-runs the task, perhaps behind another worker's whole
attempt. The driver waited for that re-run with every merge stalled (a
stopping run waited 14 s on this machine). Now it waits ``GATHER_SECONDS``
(flows/epoch_returns.py) and takes what the task recorded in the ledger. Here the re-run is a Dask
future that will not finish for a minute: the wait a lost output causes.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from prefect import flow
from prefect_dask.task_runners import PrefectDaskFuture

import flows.epoch_returns
from flows.epoch import EpochExecutor
from flows.workarounds.shared_runner import shared_task_runner
from tests.daskfixture import local_cluster
from tests.integration.test_failure_modes import make_run
from vcdl.driver.epoch_events import TaskLost, TaskReturned
from vcdl.worker.attempt import run_attempt

# Under `pytest -n 2` this runs with no other test beside it (tests/lanes.py):
# what it asserts depends on timing.
pytestmark = pytest.mark.alone


@pytest.mark.usefixtures("prefect_api")
def test_an_output_lost_with_its_worker_is_read_from_the_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, cfg = make_run(tmp_path)
    trained = run_attempt(ref, 0, 0, config=cfg)  # its task's output is what was lost
    monkeypatch.setattr(flows.epoch_returns, "GATHER_SECONDS", 1.0)

    with local_cluster(1) as (cluster, _), shared_task_runner(cluster.scheduler_address) as runner:

        @flow
        def drive() -> list[tuple[Any, float]]:
            executor = EpochExecutor(ref, cfg, 0, final=True)
            out = []
            for shard in (0, 1):  # shard 1 has no attempt in the ledger
                rerun = runner.client.submit(time.sleep, 60, pure=False)
                started = time.monotonic()
                event = executor._returned(PrefectDaskFuture(uuid.uuid4(), rerun), (0, shard))
                out.append((event, time.monotonic() - started))
                rerun.cancel()
            return out

        (found, found_s), (lost, lost_s) = drive.with_options(task_runner=runner)()  # type: ignore[arg-type]

    assert isinstance(found, TaskReturned)
    assert (found.kind, found.attempt_id) == ("finished", trained.attempt_id)
    assert found.samples == trained.samples
    assert isinstance(lost, TaskLost) and "worker left" in lost.reason
    assert found_s < 10 and lost_s < 10  # not the re-run's 60 s
