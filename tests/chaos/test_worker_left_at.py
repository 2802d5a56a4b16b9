"""When a worker died, from the Dask scheduler's log: what a killed attempt is billed to.

Real LocalCluster, real SIGKILL: the time found is after the kill and before
the driver would have noticed (here: the moment the test asks).
"""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime, timedelta

import pytest
from distributed import Client, LocalCluster

from flows.cluster import worker_left_at
from tests.daskfixture import local_cluster, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.alone]


def test_worker_left_at_is_when_the_scheduler_saw_the_worker_die() -> None:
    with local_cluster() as (_, client):
        pids = client.run(os.getpid)
        victim, survivor = sorted(pids)
        before = datetime.now(UTC)
        assert worker_left_at(victim, before - timedelta(hours=1)) is None  # alive
        killed = datetime.now(UTC)
        os.kill(pids[victim], signal.SIGKILL)
        wait_until(
            lambda: victim not in client.scheduler_info()["workers"], 30, "the worker to leave"
        )
        time.sleep(2.0)  # the driver finds out later; the answer must not move with it
        asked = datetime.now(UTC)
        left = worker_left_at(victim, before)
        assert left is not None, "the scheduler logged no removal of the killed worker"
        assert killed - timedelta(seconds=0.05) <= left <= asked - timedelta(seconds=1.5)
        # A removal before the attempt started is not this attempt's end.
        assert worker_left_at(victim, left + timedelta(seconds=1)) is None
        assert worker_left_at(survivor, before) is None


def test_worker_left_at_without_a_client_is_none() -> None:
    # No Dask client in this process: the caller falls back to "now".
    assert worker_left_at("tcp://127.0.0.1:1", datetime.now(UTC)) is None


def test_worker_left_at_asks_the_client_it_is_given() -> None:
    """The driver's client is not Dask's default (flows/cluster.py): it must be the one asked.

    Before it was passed, a run with no other client in its process (any run
    without the preemption simulator) billed killed attempts until the driver
    found out.
    """
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        client.wait_for_workers(2, timeout=60)
        pids = client.run(os.getpid)
        victim = sorted(pids)[0]
        before = datetime.now(UTC)
        os.kill(pids[victim], signal.SIGKILL)
        wait_until(
            lambda: victim not in client.scheduler_info()["workers"], 30, "the worker to leave"
        )
        left = worker_left_at(victim, before, client)
        assert left is not None and before <= left <= datetime.now(UTC)
