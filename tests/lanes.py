"""Two test processes (``pytest -n 2``) and the tests that must have the machine to themselves.

With pytest-xdist, two workers run tests side by side. Most tests do not
care; a test that asserts a duration, a ratio of timings, a memory figure or
a run's accuracy under a kill schedule does, because on a 2-core machine a
neighbour changes what it measures. Those are marked ``alone`` and run
while the other worker waits between tests.

The rule is a readers-writer lock on two files that every worker of one
session opens: an ordinary test holds the room shared, an ``alone`` test
holds it exclusively. A turnstile in front of the room keeps a waiting
``alone`` test from being overtaken forever by the other worker's stream of
ordinary tests (Linux ``flock`` gives a waiting writer no priority).

The lock spans a test's whole protocol (setup, call, teardown), so session
fixtures that a test starts first (a Prefect server, a moto server) are
started inside it. Without xdist (the default, and CI) nothing is locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["ALONE", "held", "lane"]

ALONE = "alone"


def _lock_dir(config: pytest.Config) -> Path | None:
    """A directory that all workers of this xdist session share, or None without xdist.

    xdist gives each local worker the basetemp ``<session's basetemp>/popen-gwN``:
    the parent is the session's own, and pytest's retention of old basetemps
    removes it with the rest (a directory of our own in /tmp stayed behind,
    one per session).
    """
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return None
    basetemp = getattr(config.option, "basetemp", None)
    if basetemp:
        path = Path(basetemp).parent / "lanes"
    else:  # a worker xdist gave no basetemp (not a local one): one per test run
        path = Path(tempfile.gettempdir()) / f"vcdl-test-lanes-{workerinput['testrunuid']}"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def _flocked(path: Path, how: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, how)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases its lock


@contextlib.contextmanager
def held(lock_dir: Path, alone: bool) -> Iterator[None]:
    """Hold the room: exclusively when ``alone``, shared otherwise."""
    turnstile, room = lock_dir / "turnstile", lock_dir / "room"
    if alone:
        # Keep the turnstile while in the room: no new shared holder enters.
        with _flocked(turnstile, fcntl.LOCK_EX), _flocked(room, fcntl.LOCK_EX):
            yield
        return
    with contextlib.ExitStack() as stack:
        with _flocked(turnstile, fcntl.LOCK_EX):
            stack.enter_context(_flocked(room, fcntl.LOCK_SH))
        yield


@contextlib.contextmanager
def lane(item: pytest.Item) -> Iterator[None]:
    """Run ``item`` under the lanes' rule (a no-op outside an xdist worker)."""
    lock_dir = _lock_dir(item.config)
    if lock_dir is None:
        yield
        return
    with held(lock_dir, alone=item.get_closest_marker(ALONE) is not None):
        yield
