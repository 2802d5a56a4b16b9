"""A SIGTERM to pytest tears the session down, as Ctrl-C does.

Python's default SIGTERM ends the process at once: no fixture finalizer
runs. The session fixtures that start servers in their own process groups
(the e2e ``prefect server`` and ``prefect worker``, the fleet test's Dask
and Prefect processes) then run on with nobody to stop them; two left by a
``timeout``-stopped run were found an hour later, using ~9 % of a CPU and
slowing the next run. Raised as :class:`KeyboardInterrupt`, pytest unwinds:
the test in progress fails, and every finalizer, session ones included, runs.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import pytest

__all__ = ["pytest_sessionstart"]


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"pytest received signal {signum} (SIGTERM)")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # Tests that install their own SIGTERM handler (vcdl.termination, the
    # preemption notice) put back the one they found: this one.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
