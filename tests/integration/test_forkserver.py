"""LocalCluster workers forked from the preloaded server (flows/workarounds/forkserver.py).

A real cluster from :func:`flows.cluster.dask_cluster`: the workers must
report to the flow's Prefect API (not start their own server) with the
configured torch threads, although Prefect and torch were imported in the
server before any nanny set the workers' environment; and a SIGKILLed worker
must be back and running tasks quickly (a spawned one imports for ~4 s).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from distributed import Client

from flows.cluster import dask_cluster, prefect_api_url
from vcdl.config import RunConfig

# Under `pytest -n 2` this runs with no other test beside it (tests/lanes.py):
# what it asserts depends on timing.
pytestmark = pytest.mark.alone


def _inside() -> dict[str, Any]:
    import psutil
    import torch
    from prefect.settings import PREFECT_API_URL

    return {
        "pid": os.getpid(),
        "parent": psutil.Process().ppid(),
        "api": PREFECT_API_URL.value(),
        "threads": torch.get_num_threads(),
    }


def _cfg(method: str) -> RunConfig:
    return RunConfig.model_validate(
        {"cluster": {"workers": 2, "start_method": method}, "train": {"threads": 1}}
    )


def _replace_one(client: Client) -> tuple[float, dict[str, Any]]:
    """SIGKILL one worker; seconds until its replacement ran a task, and what it saw."""
    pids = client.run(os.getpid)
    victim = sorted(pids)[0]
    start = time.monotonic()
    os.kill(pids[victim], signal.SIGKILL)
    while time.monotonic() - start < 60:
        workers = client.scheduler_info()["workers"]
        new = [w for w, info in workers.items() if w not in pids and info["status"] == "running"]
        if new:
            seen = client.submit(_inside, workers=new, pure=False).result(timeout=60)
            return time.monotonic() - start, seen
        time.sleep(0.02)
    raise AssertionError("no replacement worker within 60 s")


@pytest.mark.usefixtures("prefect_api")
def test_forked_workers_see_the_flow_api_and_replace_a_killed_one_fast() -> None:
    api = prefect_api_url()
    assert api, "the test harness gives the flow an API"
    with dask_cluster(_cfg("forkserver")) as address, Client(address) as client:
        client.wait_for_workers(2, timeout=60)
        first = client.run(_inside)
        for seen in first.values():
            assert seen["parent"] != os.getpid(), "forked by the server, not spawned here"
            assert seen["api"] == api and seen["threads"] == 1

        took, seen = _replace_one(client)
        assert seen["api"] == api and seen["threads"] == 1
        # Forked with everything imported: ~0.15 s idle here; spawned, ~4 s.
        assert took < 2.5, f"a killed worker took {took:.1f} s to run a task again"


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_spawn_is_still_there_and_slower() -> None:
    """``cluster.start_method = "spawn"``: fresh interpreters, children of the driver."""
    with dask_cluster(_cfg("spawn")) as address, Client(address) as client:
        client.wait_for_workers(2, timeout=60)
        assert {s["parent"] for s in client.run(_inside).values()} == {os.getpid()}
        took, seen = _replace_one(client)
        assert seen["api"] == prefect_api_url()
        assert took > 1.0, "a spawned worker imports torch, Prefect and vcdl again"
