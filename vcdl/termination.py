"""SIGTERM to a ``vcdl`` command: stopped as Ctrl-C stops it, never killed mid-way.

This module owns what the command line does with a termination signal. The
machines that send one are the ones vcdl runs on: a spot instance's
interruption notice, ``docker stop``, ``systemctl stop``, Kubernetes deleting
a pod. Python's default for SIGTERM ends the process at once: no ``finally``
and no ``atexit``, so the Prefect API server a run started for itself (a
child process) was left running with nobody to stop it, and the command
printed nothing.

Here SIGTERM raises :class:`Terminated` in the main thread, a
:class:`KeyboardInterrupt`: everything that winds a run down after Ctrl-C
(Prefect marks the flow run crashed, the Dask cluster closes, the temporary
API server stops) does the same after SIGTERM, and the CLI says what
happened and exits 143 (128 + SIGTERM). Prefect's own flow engine catches
SIGTERM while a flow runs; it then restores the handler it found (this one)
and sends the signal again, which lands here.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

TERMINATED_EXIT = 143
"""128 + SIGTERM, what a shell reports for a process SIGTERM ended."""


class Terminated(KeyboardInterrupt):
    """The process got SIGTERM; handled wherever Ctrl-C is."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread.

    Only the main thread can own a signal handler; elsewhere (a command run
    from a thread, as a test may) the block changes nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
