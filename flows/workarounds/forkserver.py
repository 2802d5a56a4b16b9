"""Worker processes forked from a process that has already imported vcdl's hot path.

A LocalCluster nanny restarts a worker it lost (a spot kill, a crash). With
the default ``spawn`` start method every replacement is a fresh interpreter
that imports distributed, torch (its first optimizer step pulls in
``torch._dynamo``), Prefect's task engine and vcdl again: ~4 s on an idle
2-core machine, twice that under load, with the worker idle. With
``forkserver`` the nanny asks one long-lived server process to fork the
worker; the server imported all of that once, so a replacement runs its
first task in a fraction of a second (benchmarks/overhead.py ``--kill-every``).

This module owns that server: which modules it preloads and the environment
it starts with. It is one per driver process (Python's
:mod:`multiprocessing.forkserver`) and starts with the workers' environment
(Dask's pre-spawn variables, ``OMP_NUM_THREADS`` and the Prefect API URL),
because libraries read some variables once, at import. A later cluster in the
same process reuses the server; what a worker reads after it starts (Prefect's
settings, torch's thread count) is refreshed by the warm-up plugin
(:func:`flows.workarounds.warmup.warm_up`) from the nanny's environment.

Works around distributed 2026.8's nanny starting each worker with
``spawn``. Guarded by ``tests/integration/test_forkserver.py``.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import dask

# Imported once in the server, inherited by every worker it forks. Only
# imports: the server must not start threads or run torch kernels (a fork
# copies one thread, and an initialized OpenMP pool does not survive it).
PRELOAD: tuple[str, ...] = (
    "distributed",
    "numpy",
    "torch",
    "torch._dynamo",  # imported by the first optimizer step: ~1 s
    "torch.optim",
    "zarr",
    "sqlalchemy",
    "prefect.task_engine",
    "flows.tasks",  # the shard task and vcdl's hot path: ledger, store, train
)

_lock = threading.Lock()


@contextmanager
def _environ(env: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` updated with ``env`` inside the block, restored after."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def start_forkserver(env: Mapping[str, str]) -> None:
    """Start this process's forkserver with :data:`PRELOAD` imported, unless it runs already.

    ``env`` is added to the server's environment (the nanny applies the
    workers' environment again in each worker, after the fork).
    """
    pre_spawn = {
        k: str(v)
        for k, v in (dask.config.get("distributed.nanny.pre-spawn-environ") or {}).items()
        if v is not None
    }
    with _lock, _environ({**pre_spawn, **env}):
        # Only read when the server starts; a running server keeps its modules.
        multiprocessing.get_context("forkserver").set_forkserver_preload(list(PRELOAD))
        multiprocessing.forkserver.ensure_running()


@contextmanager
def forked_workers(env: Mapping[str, str]) -> Iterator[None]:
    """Inside the block, Dask nannies start worker processes from the preloaded forkserver."""
    start_forkserver(env)
    with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
        yield
