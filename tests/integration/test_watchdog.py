"""The LocalCluster watchdog on a real cluster: a worker the cluster forgot comes back.

Reproduces the failure it exists for: a killed worker whose restart takes
longer than ``lost-worker-timeout`` is closed and forgotten by the
SpecCluster (here the timeout is made tiny so any restart is "too slow").
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

from distributed import Client

from flows.workarounds.watchdog import ClusterWatchdog
from tests.daskfixture import local_cluster, wait_until


def _replaces(dog: ClusterWatchdog, client: Client, name: object) -> None:
    """Once the forgotten worker has left the scheduler, one check starts its replacement."""
    wait_until(lambda: dog.forgotten() == {name}, 30, "the old worker to unregister")
    assert dog.check() == 1
    wait_until(
        lambda: len(dog.cluster.workers) == 2 and len(client.scheduler_info()["workers"]) == 2,
        60,
        "a replacement worker",
    )


def test_watchdog_restarts_a_worker_the_cluster_forgot() -> None:
    with local_cluster(config={"distributed.deploy.lost-worker-timeout": "0.1s"}) as (
        cluster,
        client,
    ):
        pids = client.run(os.getpid)
        victim = sorted(pids)[0]
        victim_name = client.scheduler_info()["workers"][victim]["name"]
        os.kill(pids[victim], signal.SIGKILL)
        # The nanny restarts the process, but the cluster has already given up on it.
        wait_until(lambda: len(cluster.workers) == 1, 30, "the cluster to forget the worker")

        dog = ClusterWatchdog(cluster, workers=2, interval=0.5)
        _replaces(dog, client, victim_name)
        assert dog.check() == 0 and dog.forgotten() == set()  # whole again
        assert client.submit(lambda x: x + 1, 1).result(timeout=30) == 2
        assert pids[victim] not in client.run(os.getpid).values()

        # As a thread: it does the same on its own.
        dog.start()
        name = sorted(cluster.workers)[0]
        cluster.sync(cluster.workers.pop(name).close)
        wait_until(
            lambda: len(cluster.workers) == 2 and len(client.scheduler_info()["workers"]) == 2,
            60,
            "the watchdog thread",
        )
        dog.stop()
        dog.join(timeout=5)
        assert dog.replaced >= 2


def test_watchdog_restarts_a_worker_whose_nanny_failed_to_restart_it() -> None:
    """The Nanny stays in the cluster with no process: nothing looks missing to it."""
    with local_cluster() as (cluster, client):
        pids = client.run(os.getpid)
        victim = sorted(pids)[0]
        victim_name = client.scheduler_info()["workers"][victim]["name"]
        nanny = cluster.workers[victim_name]

        async def fails(*args: object, **kwargs: object) -> None:
            # What a restart does when the new process is killed while it starts.
            raise RuntimeError("simulated: the new worker process failed to start")

        nanny.instantiate = fails
        dog = ClusterWatchdog(cluster, workers=2, interval=0.5, stuck_after=2.0)
        os.kill(pids[victim], signal.SIGKILL)
        wait_until(lambda: len(client.scheduler_info()["workers"]) == 1, 30, "the worker to leave")
        assert victim_name in cluster.workers  # the broken Nanny keeps its place...
        assert dog.forgotten() == set() and dog.check() == 0  # ...so the cluster looks whole
        assert dog.stuck() == set() and dog.restart_stuck() == 0  # not yet stuck_after
        time.sleep(2.5)
        assert dog.stuck() == {victim_name}
        assert dog.restart_stuck() == 1
        wait_until(
            lambda: len(client.scheduler_info()["workers"]) == 2,
            60,
            "the worker started afresh",
        )
        assert cluster.workers[victim_name] is not nanny
        assert client.submit(lambda x: x + 1, 1).result(timeout=30) == 2
        assert dog.stuck() == set() and dog.restarted == 1


def test_watchdog_waits_for_a_dropped_nanny_that_is_still_restarting() -> None:
    """The race CI hit: a dropped Nanny finishes its restart while it is closed.

    When the cluster gives up on a Nanny that is restarting its process, the
    restart can still register a worker under the Nanny's name. A replacement
    started in that window fails with "name taken" and leaves the entry with a
    Nanny and no process. The watchdog waits until the dropped Nanny is closed.
    """
    with local_cluster() as (cluster, client):
        pids = client.run(os.getpid)
        victim = sorted(pids)[0]
        victim_name = client.scheduler_info()["workers"][victim]["name"]
        nanny = cluster.workers[victim_name]
        instantiate = nanny.instantiate

        async def slow(*args: object, **kwargs: object) -> object:
            await asyncio.sleep(3)  # a restart on a loaded machine
            return await instantiate(*args, **kwargs)

        nanny.instantiate = slow
        os.kill(pids[victim], signal.SIGKILL)
        wait_until(lambda: len(client.scheduler_info()["workers"]) == 1, 30, "the worker to leave")
        # What the SpecCluster does after lost-worker-timeout, less the close.
        cluster.workers.pop(victim_name)
        dog = ClusterWatchdog(cluster, workers=2, interval=0.5)
        assert dog.forgotten() == set() and dog.check() == 0  # it is still restarting
        wait_until(
            lambda: len(client.scheduler_info()["workers"]) == 2, 60, "the restart to register"
        )
        assert dog.forgotten() == set()
        cluster.sync(nanny.close)
        _replaces(dog, client, victim_name)
        assert cluster.workers[victim_name] is not nanny
        assert client.submit(lambda x: x + 1, 1).result(timeout=30) == 2
