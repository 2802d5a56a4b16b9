"""Where an attempt's time outside its training body went: queueing, Dask, Prefect. Pure.

The driver knows when it submitted a task and when the result came back; the
task's wall-clock marks say when Dask started it, when its body began, when
its read-ahead was done, when it held a training slot, when its worker's
memory admitted it and when its body ended. :func:`dispatch_phases` splits
the difference into phases the ledger records with the attempt (``vcdl
status`` shows their means). When the driver also noted the moment its
client learned the task was done (``arrived``: the future's done-callback),
the wait from then until its epoch loop took the result -- behind merges,
on the driver's machine -- is ``driver_queue``, not Prefect's.
"""

from __future__ import annotations

from collections.abc import Mapping


def dispatch_phases(
    sent: float,
    ready: float,
    received: float,
    clock: Mapping[str, float | None],
    arrived: float | None = None,
) -> dict[str, float]:
    """Split one attempt's time outside its training body .

    ``sent``: the driver's submission; ``ready``: when the worker was free (not
    before ``sent``); ``received``: the result taken by the driver's epoch
    loop; ``arrived``: when the driver's client learned the task was done (None:
    not noted, all of it counts as ``prefect``); ``clock``: the task's
    wall-clock marks (``dask_started``, ``body_started``, ``prefetched``,
    ``slot_acquired``, ``admitted``, ``body_ended``). Pure, for tests.
    """
    begun, started, ended = clock.get("dask_started"), clock["body_started"], clock["body_ended"]
    assert started is not None and ended is not None
    acquired = clock.get("slot_acquired") or started
    prefetched = clock.get("prefetched") or started
    if begun is None:  # not run by a Dask worker thread: all of it is "dispatch"
        return {"dispatch": max(0.0, started - ready + received - ended)}
    back = received if arrived is None else min(max(arrived, ended), received)
    # The read-ahead delays the attempt only where it ran after the worker was free.
    prefetch = max(0.0, prefetched - max(started, ready))
    phases = {
        "queued": max(0.0, min(ready, begun) - sent) + max(0.0, acquired - started - prefetch),
        "prefetch": prefetch,
        "scheduling": max(0.0, begun - ready),
        # Prefect's engine before the body, and after it plus the return of
        # the result dict through Dask (a few hundred bytes).
        "prefect": max(0.0, started - begun) + max(0.0, back - ended),
    }
    if arrived is not None:
        # Done, but not yet taken: the driver was merging (or fetching) others.
        phases["driver_queue"] = max(0.0, received - back)
    admitted = clock.get("admitted")
    if admitted is not None:
        # Waiting for the worker's memory (vcdl.worker.admission), slot held.
        phases["memory_wait"] = max(0.0, admitted - acquired)
    return phases
