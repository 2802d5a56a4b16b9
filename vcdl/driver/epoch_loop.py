"""The epoch loop: a run's epochs in order, the next one's set-up hidden behind the current one.

Each epoch is its own Prefect flow run, and a flow run's boundary costs
Prefect's API five round trips (create the next run, name it, set it
Running; set the previous one Completed): 0.2-0.25 s at every barrier here,
with every worker idle (docs/results.md, "Pipelined epoch
subflows"). With attempts of a fraction of a second that is a tenth of the
run.

docs/design.md's barrier is unchanged: epoch e+1's driver touches nothing — the
ledger, the store, Dask — before epoch e's driver has passed its barrier
(every shard merged or recorded, ``epochs_completed`` advanced). Only
Prefect's bookkeeping overlaps: e+1's subflow is started in a thread once e
is in its tail (no more results left to wait for than there are workers) and
waits at its first line for e's :class:`EpochGate`; e's run is set Completed
in its own thread while e+1 already dispatches. For a moment two epoch runs
show as Running in Prefect's UI; the later one is waiting. Under
``cluster.overlap_epochs`` the waiting epoch submits its fresh shards first
(``StartEarly``, flows/epoch.py), and only their merges wait for the barrier.

A failed epoch stops the run: the next one, if started, gives up without
touching anything and ends Cancelled. So does an interrupt of the train flow.

Pure threading: it knows neither Prefect nor Dask (``run_epoch`` is the
epoch subflow). It exists for the cost of a flow run's boundary in Prefect
3.8's API. Guarded by ``tests/unit/test_pipeline.py`` and
``tests/integration/test_train_flow.py::test_each_epoch_acts_only_after_the_previous_barrier``.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EpochGate", "RunStopping", "current_gate", "run_epochs"]


class RunStopping(RuntimeError):
    """The run is stopping (an earlier epoch failed, or the flow was interrupted)."""


@dataclass
class EpochGate:
    """What one epoch's driver shares with :func:`run_epochs`."""

    epoch: int
    previous: threading.Event | None
    """Set when the previous epoch passed its barrier (None: nothing to wait for)."""
    abort: threading.Event
    """Set when the run stops: an epoch waiting gives up, one draining raises."""
    on_tail: Callable[[], None]
    passed: threading.Event = field(default_factory=threading.Event)
    """Set by this epoch's driver once it passed its barrier."""
    _tail_sent: bool = False

    def must_wait(self) -> bool:
        """True while the previous epoch has not passed its barrier."""
        return self.previous is not None and not self.previous.is_set()

    def wait_previous(self) -> None:
        """Block until the previous epoch passed its barrier; raise RunStopping if the run stops."""
        while self.previous is not None and not self.previous.wait(0.1):
            self.check()
        self.check()

    def check(self) -> None:
        """Raise RunStopping if the run is stopping."""
        if self.abort.is_set():
            raise RunStopping(f"epoch {self.epoch} not finished: the run is stopping")

    def tail(self) -> None:
        """This epoch waits only for its last results: the next one may set up (once)."""
        if not self._tail_sent:
            self._tail_sent = True
            self.on_tail()


_GATE: contextvars.ContextVar[EpochGate | None] = contextvars.ContextVar(
    "vcdl_epoch_gate", default=None
)


def current_gate() -> EpochGate | None:
    """The gate of the epoch this thread runs, or None outside :func:`run_epochs`."""
    return _GATE.get()


def run_epochs(run_epoch: Callable[[int], Any], epochs: Sequence[int]) -> None:
    """Call ``run_epoch(e)`` for each epoch in order, each in a thread with its gate.

    ``run_epoch`` (the epoch subflow) must call ``current_gate().wait_previous()``
    before it acts, ``tail()`` when only its last results are outstanding, and
    set ``passed`` at its barrier. The next epoch starts at the first of this
    epoch's tail or its end. Raises the first epoch's error; the epoch after
    it, if started, stops without acting. The threads run in copies of the
    caller's context (Prefect's flow run context: the subflows are children
    of the caller's flow run).
    """
    if not epochs:
        return
    events: queue.SimpleQueue[tuple[str, int]] = queue.SimpleQueue()
    abort = threading.Event()
    gates: list[EpochGate] = []
    futures: list[Future[Any]] = []

    def start(pool: ThreadPoolExecutor) -> None:
        i = len(futures)
        gate = EpochGate(
            epoch=epochs[i],
            previous=gates[-1].passed if gates else None,
            abort=abort,
            on_tail=lambda: events.put(("tail", i)),
        )
        gates.append(gate)
        ctx = contextvars.copy_context()
        ctx.run(_GATE.set, gate)
        future = pool.submit(ctx.run, run_epoch, epochs[i])
        future.add_done_callback(lambda _: events.put(("done", i)))
        futures.append(future)

    # Two threads: the epoch draining and the next one waiting at its gate.
    with ThreadPoolExecutor(2, thread_name_prefix="vcdl-epoch") as pool:
        try:
            start(pool)
            finished = 0
            while finished < len(epochs):
                try:
                    # With a timeout: an interrupt (SIGINT) reaches this thread.
                    kind, i = events.get(timeout=1.0)
                except queue.Empty:
                    continue
                if kind == "done":
                    futures[i].result()  # the epoch's error, if any
                    if not gates[i].passed.is_set():
                        raise RuntimeError(f"epoch {epochs[i]} ended without passing its barrier")
                    finished += 1
                if i == len(futures) - 1 and len(futures) < len(epochs):
                    start(pool)
        except BaseException:
            abort.set()  # the pool's exit then waits for the started epochs to give up
            raise
