"""A worker lost while a plugin is broadcast (flows/workarounds/plugin_broadcast.py).

A real LocalCluster of two worker processes; the plugin's setup ends its
worker's process the first time it runs anywhere (a marker file), as a
spot worker lost mid-broadcast. Dask's own call raises; the workaround's
installs the plugin on the workers left, and the restarted worker gets it
when it registers.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from distributed import Client, LocalCluster
from distributed.comm.core import CommClosedError
from distributed.diagnostics.plugin import WorkerPlugin

from flows.workarounds.plugin_broadcast import register_surviving

pytestmark = [pytest.mark.timeout(180)]


class DiesOnce(WorkerPlugin):
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def setup(self, worker: object) -> None:
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return
        os._exit(1)  # the worker's process gone mid-broadcast


def _has(dask_worker: object, name: str) -> bool:
    return name in dask_worker.plugins  # type: ignore[attr-defined]


def test_a_worker_lost_mid_broadcast_fails_dasks_call_not_the_workaround(tmp_path: Path) -> None:
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, dashboard_address=None, silence_logs=logging.ERROR
        ) as cluster,
        Client(cluster) as client,
    ):
        first = tmp_path / "first"
        # Upstream (distributed 2026.8): the whole call fails. When this stops
        # raising, the workaround can go.
        with pytest.raises(CommClosedError):
            client.register_plugin(DiesOnce(str(first)), name="dies-once-upstream")
        assert first.exists()
        client.wait_for_workers(2, timeout=60)

        second = tmp_path / "second"
        register_surviving(client, DiesOnce(str(second)), "dies-once")
        assert second.exists()
        client.wait_for_workers(2, timeout=60)
        seen = client.run(_has, name="dies-once")
        assert len(seen) == 2 and all(seen.values()), seen
