"""Worker side of a preemption notice: SIGTERM means "finish the batch, hand in, go".

Spot fleets warn before they reclaim a machine (AWS: two minutes, GCP: thirty
seconds; Kubernetes sends SIGTERM and waits ``terminationGracePeriodSeconds``).
:class:`Notice` is one worker process's: the worker runtime's plugin
(:mod:`vcdl.worker.runtime`) installs its SIGTERM handler in every Dask worker
process; a running attempt polls :meth:`Notice.received` at each batch
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

log = logging.getLogger(__name__)

#: ``state`` of the result a task returns when its worker, under notice, took no attempt.
PREEMPTED = "preempted"


def preempted_result(worker: str) -> dict[str, Any]:
    """What a task returns instead of training on a worker under notice.

    Not an exception: Prefect's task engine logs a raised one at ERROR with
    its traceback ("Retries are exhausted", "Finished in state Failed") for
    what is vcdl working as designed; a result is logged at INFO.
    """
    return {"state": PREEMPTED, "worker": worker, "reason": "worker has a preemption notice"}


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


class Notice:
    """One process's preemption notice: set by SIGTERM, once, and when it came.

    ``worker`` is the Dask worker of the process, if any: the notice takes it
    out of the scheduler's pool (:func:`leave_pool`).
    """

    def __init__(self, worker: Any | None = None) -> None:
        self.worker = worker
        self._event = threading.Event()
        self.at: float | None = None
        """Wall-clock time of the notice; None before one."""
        self._previous: Any = None
        self._installed = False

    def received(self) -> bool:
        """True once this process got a preemption notice (SIGTERM)."""
        return self._event.is_set()

    def set(self) -> None:
        """Take the notice (what SIGTERM does); later calls change nothing."""
        if self._event.is_set():
            return
        self.at = time.time()
        self._event.set()
        log.warning("preemption notice received: finishing the current batch")
        if self.worker is not None:
            # A signal handler must not touch the worker's state: its event
            # loop does, as soon as the handler returns.
            self.worker.loop.add_callback(leave_pool, self.worker)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # Only flag it: the attempt stops at a batch boundary and the grace
        # period's SIGKILL (or the orchestrator) ends the process.
        self.set()

    def install(self) -> bool:
        """Install the SIGTERM handler; only possible from the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return False
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._installed = True
        return True

    def uninstall(self) -> None:
        """Put back the handler :meth:`install` replaced, where this one is still installed."""
        if not self._installed or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._previous)
        self._installed = False
