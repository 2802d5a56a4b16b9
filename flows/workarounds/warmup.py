"""A worker's warm-up: the hot path imported, torch run once, the allocator set.

Works around three behaviours seen with distributed 2026.8 and Prefect 3.8:
a worker's first shard task stalled 5-7 s on imports while the run was under
way; Dask's nanny sets ``MALLOC_TRIM_THRESHOLD_``, which made training ~40 %
slower (:mod:`vcdl.worker.allocator`); a worker forked from the preloaded
server read Prefect's settings and torch's thread count before its nanny set
its environment. Guarded by ``tests/integration/test_allocator_workers.py``
and ``tests/integration/test_forkserver.py``.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from flows.workarounds.dask_logs import quiet_benign_logs
from flows.workarounds.forkserver import PRELOAD
from vcdl.console import install_for_process
from vcdl.worker.allocator import tune_allocator


def warm_up() -> None:
    """Import what a shard task needs and run torch once (its first op initializes kernels).

    A worker forked from the preloaded server (flows/workarounds/forkserver.py) imported
    Prefect and torch before its nanny set its environment: Prefect's
    settings and torch's thread count are read again from it here.
    """
    import os

    import torch
    from prefect import task_engine  # noqa: F401  (the engine that runs every task)
    from prefect.context import refresh_global_settings_context

    refresh_global_settings_context()  # PREFECT_API_URL: else the worker starts its own server
    # Dask's nanny set MALLOC_TRIM_THRESHOLD_, which makes every tensor
    # allocation a fresh mmap: training ran ~40 % slower (vcdl/worker/allocator.py).
    tune_allocator()
    # The worker shares the driver's stdout/stderr: a blocked console must not
    # stall its task threads or its event loop either.
    install_for_process()
    quiet_benign_logs()  # a worker of an external fleet logs INFO by default
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

    # The modules the forkserver preloads, by name: the shard task's module
    # among them, which imports this one's cluster (an import cycle otherwise).
    for module in PRELOAD:
        importlib.import_module(module)

    model = torch.nn.Sequential(torch.nn.Conv1d(1, 4, 3), torch.nn.Flatten(), torch.nn.Linear(8, 2))
    model(torch.zeros(4, 1, 4)).sum().backward()
    torch.optim.Adam(model.parameters()).step()


class WarmupPlugin(WorkerPlugin):
    """Imports the hot path when a worker starts, before it is given any task."""

    name = "vcdl-warmup"

    async def setup(self, worker: Any) -> None:
        # Off the event loop: seconds of imports would stall the worker's heartbeats.
        await asyncio.get_running_loop().run_in_executor(None, warm_up)
