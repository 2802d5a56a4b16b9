"""Workers of vcdl's LocalCluster train with the allocator tuned (vcdl/worker/allocator.py).

A real cluster from :func:`flows.cluster.dask_cluster` (forkserver workers,
Dask's default nanny environment with ``MALLOC_TRIM_THRESHOLD_``): a task
that allocates, touches and frees a 4 MiB tensor again and again must not
fault its pages in every time, on the first workers and on a replacement
for a SIGKILLed one (the warm-up plugin runs again on every new worker).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
from distributed import Client

from flows.cluster import dask_cluster
from vcdl.config import RunConfig

pytestmark = [
    pytest.mark.alone,
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only"),
]


def _faults_per_cycle(cycles: int = 40) -> float:
    import resource

    import torch

    # A thread's arena settles within a few cycles (seen: 5-7); then the
    # steady state, which is what every training step sees.
    for _ in range(20):
        torch.ones(1 << 20)
    # This thread's faults only: the worker's other threads fault pages too.
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for _ in range(cycles):
        t = torch.ones(1 << 20)  # 4 MiB of float32, every page written
        del t
    return (resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before) / cycles


def _env() -> str | None:
    return os.environ.get("MALLOC_TRIM_THRESHOLD_")


@pytest.mark.usefixtures("prefect_api")
def test_workers_and_their_replacements_allocate_from_the_heap() -> None:
    cfg = RunConfig.model_validate({"cluster": {"workers": 2}, "train": {"threads": 1}})
    with dask_cluster(cfg) as address, Client(address) as client:
        # The environment that made every tensor an mmap is still there...
        assert set(client.run(_env).values()) == {"65536"}
        workers = list(client.scheduler_info()["workers"])
        faults = client.gather(
            [client.submit(_faults_per_cycle, workers=[w], pure=False) for w in workers]
        )
        # ...but the warm-up's mallopt keeps 4 MiB blocks on the heap (1 024
        # faults per cycle on the mmap path).
        assert max(faults) < 10, faults

        pids = client.run(os.getpid)
        os.kill(pids[workers[0]], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            info = client.scheduler_info()["workers"]
            new = [w for w, i in info.items() if w not in pids and i["status"] == "running"]
            if new:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("no replacement worker within 60 s")
        replacement = client.submit(_faults_per_cycle, workers=new, pure=False).result(timeout=60)
        assert replacement < 10, replacement
