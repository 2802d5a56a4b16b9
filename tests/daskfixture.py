"""A real Dask LocalCluster of worker processes, for the tests that kill its workers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import dask
import pytest
from distributed import Client, LocalCluster


@contextmanager
def local_cluster(
    workers: int = 2, config: Mapping[str, Any] | None = None
) -> Iterator[tuple[LocalCluster, Client]]:
    """``workers`` worker processes (one thread each) and a client, every worker up.

    ``config`` is Dask configuration set for the cluster's lifetime.
    """
    with (
        dask.config.set(dict(config or {})),
        LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(workers, timeout=60)
        yield cluster, client


def wait_until(cond: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``cond`` until it is true; fail the test naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")
