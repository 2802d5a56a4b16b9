"""Worker side of a preemption notice: SIGTERM means "finish the batch, hand in, go".

Spot fleets warn before they reclaim a machine (AWS: two minutes, GCP: thirty
seconds; Kubernetes sends SIGTERM and waits ``terminationGracePeriodSeconds``).
:class:`PreemptionPlugin` installs a SIGTERM handler in every Dask worker
process; a running attempt polls :func:`notice_received` at each batch
boundary, stops, and writes a partial result with the number of samples it
processed. The run's ``fault.partial`` policy then merges it scaled by the
fraction processed, or discards it and reissues the subtask.

A worker under notice takes no new attempt: its task returns
:func:`preempted_result` (a normal result, so Prefect logs no ERROR and
spends no retry on a worker whose notice never clears) and the driver
reissues the subtask elsewhere.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

log = logging.getLogger(__name__)

_NOTICE = threading.Event()
_NOTICE_AT: list[float] = []


#: ``state`` of the result a task returns when its worker, under notice, took no attempt.
PREEMPTED = "preempted"


def preempted_result(worker: str) -> dict[str, Any]:
    """What a task returns instead of training on a worker under notice.

    Not an exception: Prefect's task engine logs a raised one at ERROR with
    its traceback ("Retries are exhausted", "Finished in state Failed") for
    what is vcdl working as designed; a result is logged at INFO.
    """
    return {"state": PREEMPTED, "worker": worker, "reason": "worker has a preemption notice"}


def notice_received() -> bool:
    """True once this process got a preemption notice (SIGTERM)."""
    return _NOTICE.is_set()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Only flag it: the attempt stops at a batch boundary and the grace
    # period's SIGKILL (or the orchestrator) ends the process.
    if not _NOTICE.is_set():
        _NOTICE_AT.append(time.time())
        _NOTICE.set()
        log.warning("preemption notice received: finishing the current batch")


def install_handler() -> bool:
    """Install the SIGTERM handler; only possible from the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, _on_sigterm)
    return True


def reset_for_tests() -> None:
    _NOTICE.clear()
    _NOTICE_AT.clear()


class PreemptionPlugin(WorkerPlugin):
    """Registered on every worker (also on workers that join later)."""

    name = "vcdl-preemption"

    def setup(self, worker: Any) -> None:
        # setup runs on the worker's event loop; with a nanny that loop is the
        # worker process's main thread, where signal handlers may be set.
        if not install_handler():
            worker.loop.add_callback(install_handler)
