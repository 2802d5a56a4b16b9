"""Emulated compute speeds (``cluster.speeds``): which factor a worker runs at, and the pace.

A spot fleet mixes instance types; on one machine the same is had by
slowing workers down. A worker of speed ``s`` trains each batch as fast as
it can, measures how long that took, and then waits ``(1/s − 1)`` times as
long, so that its wall time per batch is ``1/s`` of its own: the slowdown
follows the worker's real pace (a busy neighbour slows it further, as on a
real fleet) instead of a fixed sleep. The wait is counted as training time
(the driver sees the slow worker's throughput) and, separately, as
``emulated_wait`` in the attempt's timings, so no figure passes for real.

Pure except :class:`Pacer`'s sleep, which polls the attempt's stop signal
(a preemption notice ends the wait at once, as it ends training).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["SPEED_KEY", "WAIT_KEY", "Pacer", "speed_of", "speeds_label"]

#: In an attempt's timings: the emulated waits (seconds, within ``train``) and the
#: speed factor the attempt ran at (a factor, not a phase).
WAIT_KEY = "emulated_wait"
SPEED_KEY = "emulated_speed"

#: The longest single sleep while pacing: the stop signal is polled this often.
POLL_SECONDS = 0.2


def speed_of(worker_name: Any, speeds: Sequence[float]) -> float:
    """The speed factor of the worker named ``worker_name`` (1.0 when none is emulated).

    LocalCluster names its workers 0, 1, ...; a fleet's ``dask worker --name i``
    gives ``"i"``. Worker ``i`` runs at ``speeds[i % len(speeds)]``; a worker
    whose name is not a number runs at its own pace (1.0).
    """
    if not speeds:
        return 1.0
    try:
        index = int(str(worker_name))
    except ValueError:
        return 1.0
    return float(speeds[index % len(speeds)])


def speeds_label(speeds: Sequence[float]) -> str:
    """How outputs name emulated speeds: ``"speeds emulated: 1, 0.5"`` (empty: none)."""
    if not speeds:
        return ""
    return "speeds emulated: " + ", ".join(f"{s:g}" for s in speeds)


class Pacer:
    """Stretches each batch of an attempt to ``1/speed`` of the time it took.

    ``after_batch(seconds)`` is called with a batch's measured compute time
    and waits the rest; ``waited`` sums the emulated waits.
    """

    def __init__(
        self,
        speed: float,
        should_stop: Callable[[], bool] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not 0 < speed <= 1:
            raise ValueError(f"a speed is in (0, 1], got {speed!r}")
        self.speed = speed
        self.waited = 0.0
        self._should_stop = should_stop
        self._sleep = sleep
        self._clock = clock

    @property
    def active(self) -> bool:
        """False at full speed: nothing to wait, nothing to measure."""
        return self.speed < 1.0

    def wait_for(self, seconds: float) -> float:
        """The wait that makes ``seconds`` of compute last ``seconds / speed``."""
        return max(0.0, seconds) * (1.0 / self.speed - 1.0)

    def after_batch(self, seconds: float) -> None:
        """Wait out the emulated rest of a batch that computed for ``seconds``."""
        if not self.active:
            return
        start = self._clock()
        end = start + self.wait_for(seconds)
        while (left := end - self._clock()) > 0:
            if self._should_stop is not None and self._should_stop():
                break
            self._sleep(min(left, POLL_SECONDS))
        self.waited += self._clock() - start
