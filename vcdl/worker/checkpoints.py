"""Writing an attempt's checkpoints off the training loop.

This module owns *when* a checkpoint reaches the store, not what it holds
(:func:`vcdl.worker.loop.train_attempt` hands over a CPU copy of the weights at a
batch boundary) nor where it goes (:func:`vcdl.worker.attempt.run_attempt` writes
and records it). A synchronous write stops training for as long as the
store takes: ~10 ms for the small models here, 0.06 s for a ResNet-50 on
local disk and ~0.7 s on S3 (``benchmarks/weights_io.py``), every
``fault.checkpoint_seconds``; for a model of several GB on S3, tens of
seconds. :class:`CheckpointWriter` writes in one background thread instead:

* at most one write in flight; a checkpoint handed over meanwhile waits,
  and a newer one replaces it (only the newest is worth writing), so at
  most two copies of the weights wait in memory;
* a failed write is logged and counted, never raised into training: a
  checkpoint is insurance, and the previous one stays recorded; the count
  reaches the ledger with the attempt (``timings[FAILURES_KEY]``), so that
  ``vcdl status`` warns that kills will lose more than they should;
* :meth:`CheckpointWriter.close` drops what waits and lets the write in
  flight finish, so that the caller deletes the attempt's checkpoint after
  the last one was recorded, not before.

How often is sized to the model (:func:`checkpoint_interval`): a fixed 60 s
is right for a small model and wrong for a 4 GB one on a slow store, whose
write may take most of a minute. The interval is ``fault.checkpoint_seconds``
or ``fault.checkpoint_write_ratio`` times the last write's duration,
whichever is longer, so writes stay a bounded fraction of the training they
protect however large the model and slow the store.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from vcdl.types import StateDict

log = logging.getLogger(__name__)

FAILURES_KEY = "checkpoint_failures"
"""The key under which an attempt's ``timings`` count its failed checkpoint
writes: a count, not seconds, so no breakdown of phases sums it."""

Write = Callable[[StateDict, int, float], None]
"""Writes and records one checkpoint: (state, samples seen, training seconds)."""


def checkpoint_interval(floor: float, last_write: float | None, ratio: float) -> float:
    """Seconds of training between checkpoints.

    At least ``floor`` (``fault.checkpoint_seconds``) and at least ``ratio``
    times ``last_write``, the seconds the last checkpoint took to write
    (None before the first): a checkpoint of a model that takes 20 s to
    write is worth taking every 200 s at ratio 10, not every 60 s.
    """
    if last_write is None or last_write <= 0:
        return floor
    return max(floor, ratio * last_write)


class CheckpointWriter:
    """A :data:`vcdl.worker.loop.Checkpoint` callback that writes in a background thread."""

    def __init__(self, write: Write, name: str = "vcdl-checkpoint") -> None:
        self._write = write
        self._name = name
        self._cond = threading.Condition()
        self._waiting: tuple[StateDict, int, float] | None = None
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self.written = 0
        self.failed = 0
        self.superseded = 0
        self.write_seconds = 0.0
        """Seconds spent writing, in the background."""
        self.last_write_seconds: float | None = None
        """How long the last write took (a failed one included: it was time spent)."""

    def __call__(self, state: StateDict, samples: int, seconds: float) -> None:
        with self._cond:
            if self._closed:
                return
            if self._waiting is not None:
                self.superseded += 1
            self._waiting = (state, samples, seconds)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._waiting is None and not self._closed:
                    self._cond.wait()
                if self._waiting is None:  # closed, nothing left
                    return
                job, self._waiting, self._busy = self._waiting, None, True
            t = time.perf_counter()
            try:
                self._write(*job)
                ok = True
            except Exception:
                log.warning("checkpoint at %d samples not written", job[1], exc_info=True)
                ok = False
            with self._cond:
                took = time.perf_counter() - t
                self.write_seconds += took
                self.last_write_seconds = took
                if ok:
                    self.written += 1
                else:
                    self.failed += 1
                self._busy = False
                self._cond.notify_all()

    def interval(self, floor: float, ratio: float) -> float:
        """Seconds of training until the next checkpoint is due (:func:`checkpoint_interval`)."""
        with self._cond:
            return checkpoint_interval(floor, self.last_write_seconds, ratio)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every checkpoint handed over is written; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._waiting is not None or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> float:
        """Drop the checkpoint waiting (if any), wait for the one in flight; seconds waited."""
        t = time.perf_counter()
        with self._cond:
            self._closed = True
            if self._waiting is not None:
                self.superseded += 1
                self._waiting = None
            self._cond.notify_all()
            while self._busy:
                self._cond.wait()
        if self._thread is not None:
            self._thread.join()
        return time.perf_counter() - t
