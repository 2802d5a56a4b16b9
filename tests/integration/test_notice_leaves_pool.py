"""A worker under a preemption notice leaves Dask's pool: nothing new reaches it.

Real LocalCluster, real SIGTERM. Before, an idle worker under notice was the
scheduler's first choice for every reissue: one subtask bounced off it four
times within the grace period and its epoch failed (a CI chaos run).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
from distributed import Client, LocalCluster, Worker, get_worker

from vcdl.worker.runtime import VcdlWorkerPlugin, runtime_of

pytestmark = [pytest.mark.timeout(120), pytest.mark.alone]


def _noticed(dask_worker: Worker | None = None) -> bool:
    """In a task, or by ``Client.run`` (which hands the worker in)."""
    return runtime_of(dask_worker or get_worker()).notice_received()


def _where(_: int) -> tuple[str, bool]:
    return get_worker().address, _noticed()


def _hold(seconds: float) -> tuple[str, bool]:
    """Occupy a worker thread, then report as :func:`_where` would at the end."""
    time.sleep(seconds)
    return _where(0)


def _notice_self() -> int:
    os.kill(os.getpid(), signal.SIGTERM)
    return os.getpid()


@pytest.fixture
def cluster() -> Iterator[tuple[Client, list[str]]]:
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0"
        ) as lc,
        Client(lc) as client,
    ):
        client.register_plugin(VcdlWorkerPlugin())
        yield client, sorted(client.scheduler_info(n_workers=-1)["workers"])


def _status(client: Client, worker: str) -> str:
    return str(client.scheduler_info(n_workers=-1)["workers"][worker]["status"])


def _wait_for_status(client: Client, worker: str, status: str) -> None:
    deadline = time.monotonic() + 10
    while _status(client, worker) != status:
        assert time.monotonic() < deadline, f"{worker} still {_status(client, worker)}"
        time.sleep(0.05)


def test_noticed_worker_gets_no_new_tasks(cluster: tuple[Client, list[str]]) -> None:
    client, (noticed, healthy) = cluster
    client.run(_notice_self, workers=[noticed])
    _wait_for_status(client, noticed, "closing_gracefully")
    assert _status(client, healthy) == "running"
    # One at a time, as the driver reissues: the noticed worker is idle, the
    # scheduler's first choice were it still in the pool.
    places = [client.submit(_where, i, pure=False).result(timeout=30)[0] for i in range(12)]
    assert set(places) == {healthy}
    # Its process lives on (the grace period) and keeps its notice.
    assert client.run(_noticed, workers=[noticed]) == {noticed: True}


def test_tasks_queued_before_the_notice_run_at_once(cluster: tuple[Client, list[str]]) -> None:
    """Not held until the kill: they run, see the notice and hand back (the driver reissues)."""
    client, (noticed, _) = cluster
    # Both threads busy for 3 s and more queued behind them on the same worker.
    busy = [
        client.submit(_hold, 3.0, workers=[noticed], pure=False, key=f"busy-{i}") for i in range(2)
    ]
    queued = [
        client.submit(_where, i, workers=[noticed], pure=False, key=f"q-{i}") for i in range(2)
    ]
    deadline = time.monotonic() + 10
    while len(client.processing(workers=[noticed])[noticed]) < 4:
        assert time.monotonic() < deadline, client.processing()
        time.sleep(0.05)
    noticed_at = time.monotonic()
    client.run(_notice_self, workers=[noticed])
    _wait_for_status(client, noticed, "closing_gracefully")
    results = [f.result(timeout=30) for f in busy + queued]
    # The queued tasks ran on the noticed worker after its busy ones, saw the
    # notice, and were not held any longer than the running attempts (paused,
    # they would wait for the kill, here forever).
    assert results == [(noticed, True)] * 4
    assert time.monotonic() - noticed_at < 6.0
