"""The ``vcdl`` CLI in a process of its own, as a user starts it, for the runs that kill it.

The soak (``soak.py``) and the chaos and driver-kill tests start ``vcdl train``
and ``vcdl resume`` as separate processes, SIGKILL the driver mid-run, and
must then clean up the Dask cluster it started. Two things matter, and were
each learnt from a stalled run:

* the process's output goes to a file, ``home/<command>.log``, never to a
  pipe: nobody reads a pipe while the driver runs, and once its 64 KiB
  filled (every worker restart is logged) the driver's Dask IO loop blocked
  in a console write and the run stalled (seen in CI);
* it runs in a session (process group) of its own, so that :func:`reap`
  can kill the cluster a killed driver leaves behind.

:func:`kill_group` is that clean-up for any process started in its own
group (the tests that start ``vcdl`` or ``dask`` processes otherwise).

A helper of both a benchmark (``soak``) and the tests (the chaos, driver-kill
and console tests), so it lives here, beside the benchmark, not in
``tests/``: a benchmark imports nothing from the tests.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["kill_group", "log_tail", "reap", "start_vcdl"]


def start_vcdl(
    home: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``vcdl ARGS --home HOME`` with its own Prefect home under ``home`` (``env`` added)."""
    home.mkdir(parents=True, exist_ok=True)
    full = dict(os.environ, PREFECT_HOME=str(home / "prefect"), VCDL_HOME=str(home))
    with open(home / f"{args[0]}.log", "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "vcdl.cli", *args, "--home", str(home)],
            env=full | (env or {}),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill_group(pgid: int) -> None:
    """SIGKILL the whole process group (a driver and the cluster it started); gone is fine."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def reap(proc: subprocess.Popen[bytes]) -> None:
    """:func:`kill_group` of a process :func:`start_vcdl` started (its group is its pid)."""
    kill_group(proc.pid)


def log_tail(home: Path, command: str, chars: int = 3000) -> str:
    """The end of what ``vcdl COMMAND`` printed (for a failure's message)."""
    log = home / f"{command}.log"
    return log.read_text(errors="replace")[-chars:] if log.exists() else ""
