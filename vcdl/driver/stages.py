"""The threads a merge overlaps its stages in: a reader running ahead, a writer behind.

This module owns the two pieces of plumbing the streamed merge
(:mod:`vcdl.driver.streamed`) and a sharded merge's merger
(:mod:`vcdl.driver.merger`) run their reading and writing on, so that reading
batch k + 1, merging batch k and writing batch k - 1 overlap: :func:`prefetch`
(each job read one ahead in a thread, yielded in order) and :class:`Stage` (a
consumer thread fed through a bounded queue). Errors of either thread surface
in the caller's; closing either stops its thread. No merge logic lives here.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterator
from typing import Generic, TypeVar

__all__ = ["Stage", "prefetch"]

_T = TypeVar("_T")
_J = TypeVar("_J")


def prefetch(
    read: Callable[[_J], _T], jobs: Iterator[_J], depth: int = 1
) -> Generator[_T, None, None]:
    """``read(job)`` for each job, one ahead in a thread, yielded in order."""
    q: queue.Queue[tuple[bool, object]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def run() -> None:
        try:
            for job in jobs:
                if stop.is_set():
                    return
                q.put((True, read(job)))
        except BaseException as exc:
            q.put((False, exc))
            return
        q.put((True, _DONE))

    t = threading.Thread(target=run, name="vcdl-merge-read", daemon=True)
    t.start()
    try:
        while True:
            ok, item = q.get()
            if not ok:
                assert isinstance(item, BaseException)
                raise item
            if item is _DONE:
                return
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        while t.is_alive():  # unblock a reader waiting on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                t.join(0.01)


_DONE = object()


class Stage(Generic[_T]):
    """A consumer thread fed through a bounded queue; errors surface at the next put or exit."""

    def __init__(self, consume: Callable[[_T], None], depth: int) -> None:
        self._consume = consume
        self._q: queue.Queue[_T | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="vcdl-merge-write", daemon=True)

    def __enter__(self) -> Stage[_T]:
        self._thread.start()
        return self

    def _run(self) -> None:
        while (item := self._q.get()) is not None:
            if self._error is None:
                try:
                    self._consume(item)
                except BaseException as exc:
                    self._error = exc

    def put(self, item: _T) -> None:
        if self._error is not None:
            raise self._error
        self._q.put(item)

    def __exit__(self, *exc: object) -> None:
        self._q.put(None)
        self._thread.join()
        if self._error is not None and exc[0] is None:
            raise self._error
