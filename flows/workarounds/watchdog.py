"""Keeps a run's LocalCluster at its configured size while the run lasts.

A Nanny restarts its worker process when it dies. But when the restart takes
longer than ``distributed.deploy.lost-worker-timeout`` (15 s; a busy 2-core
machine importing torch for a new worker gets there), the ``SpecCluster``
closes that Nanny and forgets it, and nothing ever starts it again: a chaos
test once ended with no workers and a driver waiting forever. The watchdog
notices a cluster smaller than its spec and asks it to start the missing
workers (``SpecCluster.scale`` re-runs the cluster's own state correction,
which starts every spec entry that has no worker).

A Nanny can also stay while its worker does not: when the restart itself
fails (a process killed while it starts, a timeout on a loaded machine) the
Nanny logs "Failed to restart worker after its process exited" and keeps
its place in the cluster with no process; the SpecCluster sees nothing
missing. A benchmark run lost half its fleet that way for its last 150 s.
An entry whose name has not been registered at the scheduler for
``stuck_after`` seconds (well past a normal restart, warm-up included) is
closed and started afresh.

A Nanny the cluster dropped is closed in the background, and it may be in
the middle of a restart: its worker can still register under its name until
the close ends. A replacement waits for that close, or it fails with "name
taken" and the entry is left with a Nanny and no process.

A cluster given by address (``cluster.address``) is not ours to resize: its
workers come from the fleet's own manager (Kubernetes, cloud VM groups).

Works around distributed 2026.8's ``SpecCluster`` and ``Nanny``. Guarded by
``tests/integration/test_watchdog.py``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

# A Nanny in one of these states has no process and will start none.
_FINISHED = frozenset({"closed", "failed"})


def _status(nanny: Any) -> str:
    return str(getattr(getattr(nanny, "status", None), "name", ""))


class ClusterWatchdog(threading.Thread):
    """Every ``interval`` seconds, start replacements for workers the cluster forgot."""

    def __init__(
        self, cluster: Any, workers: int, interval: float = 5.0, stuck_after: float = 30.0
    ) -> None:
        super().__init__(name="vcdl-cluster-watchdog", daemon=True)
        self.cluster, self.workers, self.interval = cluster, workers, interval
        self.stuck_after = stuck_after
        self.replaced = 0
        self.restarted = 0
        self._suspects: set[Any] = set()
        self._missing_since: dict[Any, float] = {}
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def _registered(self) -> set[Any]:
        return {w.get("name") for w in self.cluster.scheduler_info.get("workers", {}).values()}

    def forgotten(self) -> set[Any]:
        """Spec entries with no worker object and no worker of that name at the scheduler."""
        missing = set(self.cluster.worker_spec) - set(self.cluster.workers)
        if not missing:
            return set()
        # A worker whose Nanny is being closed may still be registered, or may
        # register yet: a Nanny that was restarting its process when the cluster
        # gave up on it can finish that start while it closes. A replacement
        # started in either window fails with "name taken" (seen in CI).
        busy = self._registered() | self._closing()
        return {name for name in missing if name not in busy}

    def _closing(self) -> set[Any]:
        """Names of Nannies the cluster dropped that have not finished closing."""
        kept = {id(nanny) for nanny in self.cluster.workers.values()}
        created = list(getattr(self.cluster, "_created", ()))  # a WeakSet of every Nanny
        return {
            getattr(nanny, "name", None)
            for nanny in created
            if id(nanny) not in kept and _status(nanny) not in _FINISHED
        }

    def stuck(self, now: float | None = None) -> set[Any]:
        """Spec entries with a Nanny but no registered worker for ``stuck_after`` seconds."""
        now = time.monotonic() if now is None else now
        registered = self._registered()
        kept = set(self.cluster.worker_spec) & set(self.cluster.workers)
        missing = {name for name in kept if name not in registered}
        self._missing_since = {n: self._missing_since.get(n, now) for n in missing}
        return {n for n in missing if now - self._missing_since[n] >= self.stuck_after}

    async def _start_afresh(self, names: set[Any]) -> None:
        # On the cluster's event loop: the SpecCluster's state is not thread-safe.
        for name in names:
            nanny = self.cluster.workers.pop(name, None)
            if nanny is not None:
                with contextlib.suppress(Exception):  # it is broken; closing is best effort
                    await nanny.close(timeout=5, reason="vcdl-watchdog: no worker")
        await self.cluster._correct_state()

    def restart_stuck(self) -> int:
        """Close and restart entries whose Nanny has had no worker for ``stuck_after`` s."""
        due = self.stuck()
        if not due:
            return 0
        log.warning(
            "LocalCluster worker(s) %s not registered for %.0fs (their Nanny failed to "
            "restart them); starting them afresh",
            ", ".join(sorted(map(str, due))),
            self.stuck_after,
        )
        self.cluster.sync(self._start_afresh, due)
        for name in due:
            self._missing_since.pop(name, None)
        self.restarted += len(due)
        return len(due)

    def check(self, grace: bool = False) -> int:
        """One check; the number of workers asked for (0 when the cluster is whole).

        With ``grace``, a worker is replaced only when it was found forgotten by
        the previous check too (the cluster may be mid-way through its own change).
        """
        gone = self.forgotten()
        due = gone & self._suspects if grace else gone
        self._suspects = gone
        if not due:
            return 0
        log.warning(
            "LocalCluster has %d of %d workers (lost worker(s) %s not restarted in time); "
            "starting replacements",
            len(self.cluster.workers),
            self.workers,
            ", ".join(sorted(map(str, due))),
        )
        # scale() to the size it already has: the spec is unchanged and the
        # cluster starts a worker for every spec entry without one.
        self.cluster.scale(self.workers)
        self.replaced += len(due)
        self._suspects = set()
        return len(due)

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                self.check(grace=True)
                self.restart_stuck()
            except Exception as exc:  # closing cluster, loop gone: nothing to keep alive
                log.debug("cluster watchdog: %s", exc)
