"""A worker process's training slots, and its wait for its own last merge.

A worker may run more Dask tasks than it trains at once, so that the
orchestrator's per-task work for the next attempt overlaps the current
one's training (:class:`TrainingSlots`); the next attempt then waits briefly
until the driver has merged this process's previous result, so that it does
not claim a head without it (:func:`await_own_merge`). The worker runtime
(:mod:`vcdl.worker.runtime`) holds both: the slots and, per run, the last
result not yet known to be merged.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager

from vcdl.errors import LedgerError
from vcdl.runtime import RunRef
from vcdl.states import MERGEABLE_ATTEMPT_STATES

OWN_MERGE_WAIT = 1.0
"""Seconds an attempt waits at most for the previous result of its process to be merged."""


class TrainingSlots:
    """A process's places to train: one semaphore per slot count asked for."""

    def __init__(self) -> None:
        self._slots: dict[int, threading.Semaphore] = {}
        self._lock = threading.Lock()

    @contextmanager
    def hold(self, slots: int | None) -> Iterator[Callable[[], None]]:
        """Hold one of this process's ``slots`` places to train, waiting while all are taken.

        Yields a function that hands the place on before the block ends (once;
        the block's end then frees nothing more): an attempt whose result no
        next attempt waits for gives its place up when its training ends and
        writes its result meanwhile (:mod:`vcdl.worker.basecache`).

        A worker with one Dask thread more than it has slots starts the next task
        while the current one trains: Prefect's engine sets the next task up in
        the meantime (~0.1 s of CPU per task, seconds on a loaded machine), and
        the next attempt claims its base version the moment the slot frees, not
        earlier, so it still trains from the freshest head. With as many threads
        as slots it never waits; ``None`` means no limit.
        """
        if slots is None:
            yield lambda: None
            return
        with self._lock:
            slot = self._slots.setdefault(slots, threading.Semaphore(slots))
        slot.acquire()
        held = [True]

        def release() -> None:
            if held[0]:
                held[0] = False
                slot.release()

        try:
            yield release
        finally:
            release()


def await_own_merge(
    unmerged: MutableMapping[str, str],
    ref: RunRef,
    timeout: float = OWN_MERGE_WAIT,
    poll: float = 0.02,
) -> float:
    """Wait until this process's previous result of the run left the ledger's "finished" state.

    ``unmerged``: per run, the process's last recorded attempt (taken here).
    VC-ASGD trains from the head at claim time. A worker that starts its next
    attempt the moment it recorded the previous one (the spare Dask thread)
    claimed a head without its own last result, which the driver merges tens
    of milliseconds later: every result one version staler (MNIST-1D, 4
    epochs: mean staleness 1.7 instead of 0.6, test accuracy 4-5 points lower).
    Waiting is bounded by ``timeout``: a busy or dead driver costs that much
    once, not the run. Returns the seconds waited.
    """
    last = unmerged.pop(ref.run, None)
    if last is None:
        return 0.0
    ledger = ref.ledger()
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if ledger.get_attempt(last).state not in MERGEABLE_ATTEMPT_STATES:
                break
        except LedgerError:  # the row is gone (the run was deleted)
            break
        time.sleep(poll)
    return time.monotonic() - started
