"""What a returned shard task means to the epoch: its event, and the seconds around its body.

:func:`task_event` turns a finished shard task (its output, or what it raised)
into the state machine's event; when the output cannot be fetched in time
(its worker left), the ledger says what the task did. :class:`DispatchClock`
keeps the driver's side of an attempt's timeline (sent, arrived, when each
worker was last free) and turns a task's own clock into the dispatch phases
(:func:`vcdl.driver.dispatch.dispatch_phases`). Both serve
:class:`flows.epoch.EpochExecutor`, which decides nothing with them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from distributed import KilledWorker
from prefect.futures import PrefectFuture

from vcdl.driver.dispatch import dispatch_phases
from vcdl.driver.epoch_events import (
    AttemptFact,
    Event,
    Key,
    TaskLost,
    TaskReturned,
    recorded_return,
)
from vcdl.errors import LeaseLost
from vcdl.worker.preemption import PREEMPTED

GATHER_SECONDS = 10.0
"""How long the driver waits to fetch a finished task's output (a small dict, milliseconds
from a live worker). When the worker holding it has left, Dask re-runs the task,
perhaps behind another worker's whole attempt, and the wait would stall every
merge and a stopping run: past this, the ledger says what the task did."""


def task_event(
    fut: PrefectFuture[dict[str, Any]],
    key: Key,
    attempts: Callable[[], tuple[AttemptFact, ...]],
    log: logging.Logger | logging.LoggerAdapter[logging.Logger],
) -> tuple[Event, dict[str, Any] | None]:
    """The event a finished shard task makes, and its output when it names an attempt.

    ``attempts`` reads the subtask's attempts from the ledger (called only when
    the event needs them).
    """
    try:
        out = fut.result(timeout=GATHER_SECONDS)
    except TimeoutError:
        event = recorded_return(key, attempts())
        log.warning(
            "epoch %d shard %d: its task's output was not fetched in %.0fs (its worker left?); %s",
            *key,
            GATHER_SECONDS,
            f"attempt {event.attempt_id} is in the ledger"
            if isinstance(event, TaskReturned)
            else "no result in the ledger",
        )
        return event, None
    except KilledWorker as exc:
        # Dask gave up after `allowed-failures` worker deaths; Prefect would
        # leave the task run Running forever.
        lost = TaskLost(
            key,
            "KilledWorker: the workers running it died",
            attempts(),
            crashed=f"worker lost: {exc}",
        )
        return lost, None
    except LeaseLost:
        raise  # the worker's claim was refused: another driver runs the run now
    except Exception as exc:
        return TaskLost(key, f"{type(exc).__name__}: {exc}", attempts()), None
    if out["state"] == PREEMPTED:
        return TaskReturned(key, "handed_back", attempts(), worker=out["worker"]), None
    if out["state"] == "skipped":
        return TaskReturned(key, "skipped", ()), None
    returned = TaskReturned(
        key,
        out["state"],
        attempts(),
        attempt_id=str(out["attempt_id"]),
        worker=str(out.get("worker") or ""),
        samples=count(out.get("samples")),
        planned_samples=count(out.get("planned_samples")),
    )
    return returned, out


def count(value: object) -> int:
    """A sample count a task returned, for the log and the policy's messages: a broken one
    (negative, not an integer) reads 0. The merge judges the ledger's count itself and
    rejects the result for it (:func:`vcdl.driver.assimilator.report_problem`)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


@dataclass
class DispatchClock:
    """The driver's side of each attempt's timeline, for its dispatch phases."""

    submitted_at: dict[Key, float] = field(default_factory=dict)
    arrived_at: dict[Key, float] = field(default_factory=dict)
    """When the driver's client learned a subtask's task was done (its done-callback):
    from then until the loop takes it is the driver's wait."""
    worker_free_at: dict[str, float] = field(default_factory=dict)
    """When each worker last finished a task body: a task submitted while its worker
    was busy waited in a queue, which is not dispatch overhead."""

    def sent(self, key: Key) -> None:
        """The subtask's task was submitted now."""
        self.submitted_at[key] = time.time()

    def arrived(self, key: Key) -> None:
        """The subtask's task was reported done now (called from the client's thread)."""
        self.arrived_at[key] = time.time()

    def phases(self, key: Key, out: dict[str, Any]) -> dict[str, float]:
        """Seconds outside the task body (:func:`vcdl.driver.dispatch.dispatch_phases`).

        ``queued`` is time the attempt waited because its worker was busy (in
        Dask's queues, or started on the worker's spare thread and waiting for
        the training slot): not overhead. ``prefetch`` is the part of the
        read-ahead of the shard's rows that ran after the worker was free.
        ``scheduling`` counts from when the worker was free (its previous body
        ended) to Dask starting the task. ``prefect`` is the engine before and
        after the body; when the task started on the spare thread its "before"
        overlapped the previous attempt's training.
        """
        clock = out.get("clock") or {}
        sent, received = self.submitted_at.get(key), time.time()
        arrived = self.arrived_at.pop(key, None)
        started, ended = clock.get("body_started"), clock.get("body_ended")
        if sent is None or started is None or ended is None:
            return {}
        worker = str(out.get("worker") or "")
        # The attempt could not train before its worker finished the previous one.
        ready = max(sent, self.worker_free_at.get(worker, sent))
        self.worker_free_at[worker] = max(ended, self.worker_free_at.get(worker, ended))
        return dispatch_phases(sent, ready, received, clock, arrived)
