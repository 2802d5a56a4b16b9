"""The Dask cluster a train flow runs on, and what its workers need to know.

A configured ``cluster.address`` is used as is (its workers must already have
``PREFECT_API_URL`` in their environment, see docs). Otherwise a
``LocalCluster`` of worker processes is started for the flow's lifetime, with
the flow's Prefect API URL in every worker's environment: without it each
Dask worker starts its own temporary Prefect server (STACK-NOTES.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from vcdl.config import RunConfig

log = logging.getLogger(__name__)


def prefect_api_url() -> str | None:
    """The API the current flow reports to, including Prefect's ephemeral server."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if url:
        return str(url)
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    return server.api_url if server.running else None


def worker_env(cfg: RunConfig) -> dict[str, str]:
    """Environment for LocalCluster workers: the Prefect API and thread counts."""
    threads = str(cfg.train.threads)
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads}
    url = prefect_api_url()
    if url:
        env["PREFECT_API_URL"] = url
    return env


@contextmanager
def dask_cluster(cfg: RunConfig) -> Iterator[str]:
    """Yield a scheduler address: the configured one, or a LocalCluster's."""
    if cfg.cluster.address:
        register_worker_plugins(cfg.cluster.address)
        yield cfg.cluster.address
        return
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=cfg.cluster.workers,
        threads_per_worker=cfg.cluster.threads_per_worker,
        processes=True,
        memory_limit=cfg.cluster.memory_limit,
        # The scheduler always serves HTTP (health, and the dashboard when
        # bokeh is installed); a random port keeps parallel runs from clashing.
        dashboard_address=":0",
        env=worker_env(cfg),
        silence_logs=logging.WARNING,
    ) as cluster:
        log.info(
            "LocalCluster with %d workers at %s", cfg.cluster.workers, cluster.scheduler_address
        )
        register_worker_plugins(cluster.scheduler_address)
        yield cluster.scheduler_address


def register_worker_plugins(address: str) -> None:
    """Install vcdl's worker plugins; the scheduler re-applies them to workers that join later."""
    from distributed import Client

    from vcdl.preemption import PreemptionPlugin

    with Client(address, timeout=60) as client:
        client.register_plugin(PreemptionPlugin())
