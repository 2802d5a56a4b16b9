"""Waiting for a `vcdl` driver subprocess's run to reach a point, read from its ledger.

For the tests that then do something to the driver part-way (SIGKILL, SIGTERM).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen

import pytest

from vcdl.ledger import Ledger, Run


def wait_for_run(
    driver: Popen[bytes],
    db: Path,
    name: str,
    reached: Callable[[Run], bool],
    *,
    timeout: float,
    tail: Callable[[], str],
    poll: float = 0.5,
) -> Run:
    """The run ``name`` in the SQLite ledger ``db`` once ``reached`` says so.

    Fails the test, with ``tail()`` (the driver's output), if the driver exits
    first or the run is not there within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert driver.poll() is None, tail()
        if db.exists():
            run = Ledger(f"sqlite:///{db}").find_run(name)
            if run is not None and reached(run):
                return run
        time.sleep(poll)
    pytest.fail(f"the run {name!r} did not get there within {timeout:.0f} s:\n{tail()}")
