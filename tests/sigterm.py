"""A SIGTERM to pytest tears the session down, as Ctrl-C does.

Python's default SIGTERM ends the process at once: no fixture finalizer
runs. The session fixtures that start servers in their own process groups
(the e2e ``prefect server`` and ``prefect worker``, the fleet test's Dask
and Prefect processes) then run on with nobody to stop them; two left by a
``timeout``-stopped run were found an hour later, using ~9 % of a CPU and
slowing the next run. The session runs inside the CLI's own
:func:`~vcdl.termination.sigterm_as_interrupt`: SIGTERM raises a
:class:`KeyboardInterrupt`, pytest unwinds, the test in progress fails and
every finalizer, session ones included, runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator

import pytest

from vcdl.termination import sigterm_as_interrupt

__all__ = ["pytest_sessionfinish", "pytest_sessionstart"]

_HELD = pytest.StashKey[contextlib.ExitStack]()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # Tests that install their own SIGTERM handler (vcdl.termination, the
    # preemption notice) put back the one they found: this one.
    stack = contextlib.ExitStack()
    stack.enter_context(sigterm_as_interrupt())
    session.stash[_HELD] = stack


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session) -> Generator[None, None, None]:
    # Given back after the session's fixtures are torn down, which happens
    # inside this hook: a SIGTERM during that teardown still unwinds it.
    try:
        return (yield)
    finally:
        held = session.stash.get(_HELD, None)
        if held is not None:
            held.close()
