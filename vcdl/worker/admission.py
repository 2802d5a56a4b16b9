"""Memory admission on a worker: start an attempt only while the attempts it holds fit.

Why: Dask pauses a worker at 80 % of its memory limit and its nanny restarts
it at 95 %. A worker given more training slots than memory for them (eight
attempts of a 100-MB model on a 4-GiB worker: each holds its parameters,
their gradients, the base it read and its result's buffers, ~0.4 GB) reaches
95 % at the same moment every time, as its attempts write their results. It
restarts, the driver reissues all of them, they start together again, and
the run livelocks (measured: 16 slots in two 4-GiB workers merged 4 of 32
results in 4 minutes, through 10 restarts). Admitting attempts by their
estimated bytes turns that into fewer attempts at once, and a warning that
says what to change.

* :func:`attempt_bytes`, :func:`evaluation_bytes` and :func:`admits` — the
  estimates and the rule. Pure. Evaluations go through the same gate: one
  on the spare thread beside attempts that fill the budget would otherwise
  push the worker over it.
* :class:`MemoryGate` — one per worker process: attempts hold their
  estimate while they run; one that does not fit waits for others to end.
  An attempt alone on its worker is always admitted (else a model too big
  for its worker would wait for ever; Dask's own limit then decides).
* :class:`MemoryGates` — a process's gates, one per memory limit and
  admission fraction; :meth:`MemoryGates.of_worker` is the gate of a Dask
  worker, or None where there is no memory limit or admission is off. The
  worker runtime (:mod:`vcdl.worker.runtime`) holds them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

#: Copies of the model's bytes every attempt holds at its peak: parameters,
#: gradients, the base read from the store, the result's snapshot.
BASE_COPIES = 4

#: Copies of the model's bytes an evaluation holds: the model and the
#: version's state it loads (its test rows come on top, from the data cache).
EVAL_COPIES = 2

#: How often a waiting attempt looks again without being woken (it is woken
#: whenever an attempt ends): the process's resident memory may have fallen.
RECHECK_SECONDS = 2.0


def optimizer_copies(optimizer: str, momentum: float = 0.0) -> int:
    """Copies of the parameters an optimizer keeps: Adam's two moments, SGD's momentum."""
    if optimizer in ("adam", "adamw"):
        return 2
    return 1 if momentum > 0 else 0


def attempt_bytes(
    model_bytes: int, optimizer: str, momentum: float = 0.0, result_precision: str = "full"
) -> int:
    """Estimated peak bytes of one attempt of a model of ``model_bytes``.

    :data:`BASE_COPIES`, the optimizer's state, and the result's write: one
    buffer for full weights; three for a reduced-precision change (the
    float32 change, its encoding, the write's buffer). Calibrated on the
    sleeper model (SGD, 100 MB): five int8 attempts admitted together by an
    estimate of 5 copies pushed a 4-GiB worker past Dask's 95 % as they wrote
    their results, ~0.68 GB each above the process's 0.4 GB; this says 7.
    """
    result = 1 if result_precision == "full" else 3
    return model_bytes * (BASE_COPIES + optimizer_copies(optimizer, momentum) + result)


def evaluation_bytes(model_bytes: int) -> int:
    """Estimated peak bytes of evaluating a version of a model of ``model_bytes``."""
    return model_bytes * EVAL_COPIES


def admits(
    baseline: int, held: int, need: int, budget: int, in_flight: int, resident: int = 0
) -> bool:
    """May an attempt of ``need`` bytes start? Always when it would be alone.

    Else both: the estimates of the attempts admitted, above the ``baseline``,
    leave room for it (attempts admitted together, before any allocated, do
    not overrun), and the process's ``resident`` memory is within the budget
    now (it drifts above the estimates: caches, fragmentation). Not
    ``resident + need``: memory the allocator keeps after an attempt ends
    stays resident and is what the next attempt reuses (measured: that rule
    left slots idle, 18.6 % utilization against 30.5 % without it).
    """
    if in_flight == 0:
        return True
    return baseline + held + need <= budget and resident <= budget


class MemoryGate:
    """The attempts one process runs, by their estimated bytes, within ``budget``.

    ``baseline`` is the process's resident memory with no attempt admitted:
    read at creation, and again whenever the last attempt ends (caches the
    process keeps, such as decoded data, count from then on).
    """

    def __init__(self, budget: int, rss: Callable[[], int]) -> None:
        self.budget = budget
        self._rss = rss
        self._cond = threading.Condition()
        self.baseline = rss()
        self.held = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.waits = 0
        self._warned = False

    @contextmanager
    def hold(
        self,
        need: int,
        before_wait: Callable[[], None] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> Iterator[float]:
        """Hold ``need`` bytes while the block runs; yields the seconds waited for them.

        ``before_wait`` runs once, outside the lock, if the attempt must wait:
        the caller frees what it holds meanwhile (a model read ahead). Once
        ``stop()`` is true (a preemption notice) the wait ends at its next
        check: the block runs at once, to hand the task back, not to train.
        """
        started = time.monotonic()
        with self._cond:
            must_wait = not self._fits(need)
        if must_wait:
            if before_wait is not None:
                before_wait()
            self._warn(need)
        with self._cond:
            if must_wait:
                self.waits += 1
            while not self._fits(need) and not (stop is not None and stop()):
                self._cond.wait(timeout=RECHECK_SECONDS)
            self.held += need
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            yield time.monotonic() - started
        finally:
            with self._cond:
                self.held -= need
                self.in_flight -= 1
                if self.in_flight == 0:
                    self.baseline = self._rss()
                self._cond.notify_all()

    def _fits(self, need: int) -> bool:
        if self.in_flight == 0:
            return True
        return admits(
            self.baseline, self.held, need, self.budget, self.in_flight, resident=self._rss()
        )

    def _warn(self, need: int) -> None:
        if self._warned:
            return
        self._warned = True
        log.warning(
            "worker memory: an attempt needs about %.2f GB; %d running hold %.2f GB above a "
            "baseline of %.2f GB, against %.2f GB (cluster.memory_admission of the worker's "
            "memory limit). Attempts wait their turn here instead of pushing the worker into "
            "Dask's pause and restart; to train more at once, raise cluster.memory_limit or "
            "lower cluster.threads_per_worker.",
            need / 1e9,
            self.in_flight,
            self.held / 1e9,
            self.baseline / 1e9,
            self.budget / 1e9,
        )


def process_rss() -> int:
    """This process's resident bytes."""
    import psutil

    return int(psutil.Process().memory_info().rss)


class MemoryGates:
    """A process's gates: one per memory limit and admission fraction."""

    def __init__(self) -> None:
        self._gates: dict[tuple[int, float], MemoryGate] = {}
        self._lock = threading.Lock()

    def gate_for(
        self, limit: int, fraction: float, rss: Callable[[], int] = process_rss
    ) -> MemoryGate:
        """The gate for a memory ``limit`` and admission ``fraction`` (one per pair)."""
        with self._lock:
            key = (limit, fraction)
            if key not in self._gates:
                self._gates[key] = MemoryGate(int(limit * fraction), rss)
            return self._gates[key]

    def of_worker(self, worker: Any | None, fraction: float) -> MemoryGate | None:
        """The gate of Dask ``worker``; None without a limit, a worker or admission
        (``fraction`` 0)."""
        if fraction <= 0 or worker is None:
            return None
        limit = getattr(getattr(worker, "memory_manager", None), "memory_limit", None)
        if not limit:
            return None
        return self.gate_for(int(limit), fraction)


@contextmanager
def admitted(
    gate: MemoryGate | None,
    need: int,
    before_wait: Callable[[], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> Iterator[float]:
    """:meth:`MemoryGate.hold` where there is a gate and an estimate; else at once (0 s)."""
    if gate is None or need <= 0:
        yield 0.0
        return
    with gate.hold(need, before_wait, stop) as waited:
        yield waited
