"""Worker side of a preemption notice: SIGTERM means "finish the batch, hand in, go".

Spot fleets warn before they reclaim a machine (AWS: two minutes, GCP: thirty
seconds; Kubernetes sends SIGTERM and waits ``terminationGracePeriodSeconds``).
:class:`PreemptionPlugin` installs a SIGTERM handler in every Dask worker
process; a running attempt polls :func:`notice_received` at each batch
boundary, stops, and writes a partial result with the number of samples it
processed. The run's ``fault.partial`` policy then merges it scaled by the
fraction processed, or discards it and reissues the subtask.

A worker under notice takes no new attempt, in two ways. It leaves the Dask
scheduler's pool of running workers (:func:`leave_pool`): Dask routes no new
task to it, while its current attempt finishes its batch and hands in. A
task that reached it anyway (queued there before the notice, or racing it)
returns :func:`preempted_result` (a normal result, so Prefect logs no ERROR
and spends no retry) and the driver reissues the subtask elsewhere without
counting an attempt. Before the worker left the pool, an idle worker under
notice was Dask's first choice for every reissue: it bounced one subtask
four times within its grace period and the epoch failed (seen in CI).
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
# The Dask worker of this process, set by the plugin: the notice takes it out
# of the scheduler's pool.
_WORKER: list[Any] = []


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
        for worker in _WORKER:
            # A signal handler must not touch the worker's state: its event
            # loop does, as soon as the handler returns.
            worker.loop.add_callback(leave_pool, worker)


def leave_pool(worker: Any) -> None:
    """Take a Dask worker out of its scheduler's pool without stopping what it runs.

    The status ``closing_gracefully`` is what Dask's own retirement sets: the
    scheduler assigns no new task to a worker that is not ``running``
    (``paused`` would do too, but the memory monitor resumes a paused worker
    once its memory is low). Setting it also pauses the worker's own state
    machine, which would leave tasks already queued there waiting for the
    kill; resumed, they run at once, return :func:`preempted_result`, and the
    driver reissues them to workers still in the pool.
    """
    from distributed.core import Status
    from distributed.worker_state_machine import UnpauseEvent

    if worker.status not in (Status.running, Status.paused):
        return  # closing already
    # A worker the memory monitor paused stays paused (its memory is high),
    # but leaves the pool too: else the monitor would resume it into the pool.
    was_running = worker.status == Status.running
    worker.status = Status.closing_gracefully
    if was_running:
        worker.handle_stimulus(UnpauseEvent(stimulus_id=f"vcdl-preemption-notice-{time.time()}"))
    log.warning("preemption notice: %s takes no new tasks", worker.address)


def install_handler() -> bool:
    """Install the SIGTERM handler; only possible from the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, _on_sigterm)
    return True


def reset_for_tests() -> None:
    _NOTICE.clear()
    _NOTICE_AT.clear()
    _WORKER.clear()


class PreemptionPlugin(WorkerPlugin):
    """Registered on every worker (also on workers that join later)."""

    name = "vcdl-preemption"

    def setup(self, worker: Any) -> None:
        _WORKER[:] = [worker]
        # setup runs on the worker's event loop; with a nanny that loop is the
        # worker process's main thread, where signal handlers may be set.
        if not install_handler():
            worker.loop.add_callback(install_handler)
