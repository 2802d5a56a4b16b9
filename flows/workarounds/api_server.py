"""Prefect's temporary API server: out of the terminal's reach, and gone with its driver.

Works around Prefect 3.8's ephemeral API server (``SubprocessASGIServer``),
which a run without ``PREFECT_API_URL`` starts as a plain child process:

- It shares the driver's process group, so Ctrl-C in a terminal (SIGINT to
  the whole foreground group) killed it at the same instant as it asked the
  driver to stop. The driver then needed the server to record the interrupt
  and retried every Prefect call against a closed port: the digits example
  stopped with Ctrl-C after its first merge was still running, printing
  nothing useful, 4.5 minutes later.
- Nothing ties it to its driver: a driver that died without running its exit
  handlers (SIGKILL, the OOM killer) left the server running, with its port
  and memory, until someone killed it by hand.

Here the server starts in a process group of its own, and runs through
:func:`create_app`, which wraps Prefect's application factory:

- SIGTERM no longer stops it. ``systemctl stop`` (systemd's default
  ``KillMode=control-group``) sends SIGTERM to every process of the service
  at once; the server must outlive its driver's wind-down, as for Ctrl-C.
  Its driver stops it with :data:`STOP_SIGNAL` instead (Prefect's ``stop``
  calls ``terminate``, which sends that signal to this server).
- It watches its parent: when the driver is gone, it shuts down.

Guarded by ``tests/integration/test_interrupt.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import types
from typing import Any

_PREFECT_FACTORY = "prefect.server.api.server:create_app"
_FACTORY = f"{__name__}:create_app"
_POLL_SECONDS = 1.0


STOP_SIGNAL = signal.SIGUSR1
"""What stops the server gracefully (uvicorn's SIGTERM handling, moved to this signal)."""


class _ServerProcess(subprocess.Popen[Any]):
    def terminate(self) -> None:
        self.send_signal(STOP_SIGNAL)


class _OwnGroupSubprocess(types.ModuleType):
    """``subprocess`` as Prefect's server module sees it: its one ``Popen`` changed."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(args: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        # The server's own process group: the terminal's SIGINT (and any signal
        # sent to the driver's group) no longer reaches it. process_group is set
        # in the child before exec, so there is no window in which it is not.
        args = [_FACTORY if a == _PREFECT_FACTORY else a for a in args]
        return _ServerProcess(args, process_group=0, **kwargs)


def install() -> None:
    """Start Prefect's temporary API servers as described above; idempotent.

    Call before the first flow runs in this process (the server starts then).
    A process that reports to a configured API starts no server: nothing to do,
    and Prefect's server module (4 s to import here) stays unimported.
    """
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return
    from prefect.server.api import server

    if not isinstance(server.subprocess, _OwnGroupSubprocess):
        server.subprocess = _OwnGroupSubprocess("subprocess")


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_POLL_SECONDS)
    os.kill(os.getpid(), STOP_SIGNAL)


def create_app() -> Any:
    """Prefect's API application, in a server that only its driver (or its death) stops."""
    from prefect.server.api.server import create_app as prefect_app

    # uvicorn calls the factory from its main thread, after installing its own
    # handler for SIGTERM and SIGINT (a graceful shutdown): that handler moves
    # to STOP_SIGNAL, and SIGTERM is ignored.
    if threading.current_thread() is threading.main_thread():
        graceful = signal.getsignal(signal.SIGTERM)
        if callable(graceful):
            signal.signal(STOP_SIGNAL, graceful)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(
        target=_watch_parent, args=(os.getppid(),), name="vcdl-parent-watch", daemon=True
    ).start()
    return prefect_app()
