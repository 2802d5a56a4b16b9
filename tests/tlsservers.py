"""Servers speaking TLS for the tests of issue 50's item 2: S3 over HTTPS, Prefect behind an
auth string, and a Dask scheduler and workers over ``tls://``.

Each runs on loopback with a certificate of the test's CA (tests/tlscerts.py).
The processes started here are their own process groups, killed with the
test process too (``PR_SET_PDEATHSIG``), and stopped by group when the
context ends. moto runs in this process: its HTTPS server is moto's own
threaded server given an SSL context (moto is imported only there).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from tests import prefecthome
from tests.ports import free_port
from tests.tlscerts import Leaf

__all__ = [
    "Process",
    "S3Server",
    "dask_client_env",
    "dask_worker",
    "https_moto",
    "prefect_argv",
    "prefect_server",
    "scheduler_argv",
    "tls_scheduler",
    "wait_health",
    "worker_argv",
]

BIN = Path(sys.executable).parent


class S3Server(Protocol):
    """An S3 endpoint the test started: its URL, and how to stop it."""

    url: str

    def start(self) -> None: ...

    def stop(self) -> None: ...


def https_moto(leaf: Leaf) -> S3Server:
    """moto's threaded S3 server on a free loopback port, serving HTTPS with ``leaf``.

    moto is imported here: the unit tests that read this module's commands need none.
    """
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    class HttpsMotoServer(ThreadedMotoServer):
        def _server_entry(self) -> None:
            app = DomainDispatcherApplication(create_backend_app)
            self._server = make_server(
                self._ip_address,
                self._port,
                app,
                True,
                request_handler=MotoRequestHandler,
                ssl_context=(str(leaf.cert), str(leaf.key)),
            )
            self._server_ready_event.set()
            self._server.serve_forever()

        @property
        def url(self) -> str:
            host, port = self.get_host_and_port()
            return f"https://{host}:{port}"

    return HttpsMotoServer(ip_address="127.0.0.1", port=0, verbose=False)


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Process:
    """A command started in a process group of its own, its output in ``log``."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], log: Path) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                list(argv),
                env=dict(env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM to the group (a nanny and its worker), SIGKILL after 10 s."""
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
                # The group may outlive its leader (a worker after its nanny).
                os.killpg(self.proc.pid, signal.SIGKILL)
            except subprocess.TimeoutExpired:
                continue
            except ProcessLookupError:
                pass
            break


def wait_health(url: str, proc: Process, timeout: float, what: str) -> None:
    """Until GET ``url`` answers 200; raise with ``what``'s log if it exits or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if not proc.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up: {proc.text()[-3000:]}")
        time.sleep(0.3)


def _tls_flags(ca: Path | None, leaf: Leaf | None) -> list[str]:
    flags = [] if ca is None else ["--tls-ca-file", str(ca)]
    if leaf is not None:
        flags += ["--tls-cert", str(leaf.cert), "--tls-key", str(leaf.key)]
    return flags


# The commands below begin as docs/spot-fleet.md shows them (tests/unit/test_spot_fleet_tls.py
# compares); what follows that beginning only keeps a test quiet and fast.


def prefect_argv(host: str, port: int) -> list[str]:
    """``prefect server start`` as the docs show it, then the test's extras."""
    argv = ["prefect", "server", "start", "--host", host, "--port", str(port)]
    return [*argv, "--no-ui", "--analytics-off", "--no-scheduler", "--no-late-runs"]


def scheduler_argv(host: str, port: int, ca: Path, leaf: Leaf) -> list[str]:
    """``dask scheduler`` over TLS as the docs show it, then the test's extras."""
    argv = ["dask", "scheduler", "--host", host, "--port", str(port), "--protocol", "tls"]
    return [*argv, *_tls_flags(ca, leaf), "--no-dashboard"]


def worker_argv(address: str, name: str, ca: Path | None, leaf: Leaf | None) -> list[str]:
    """``dask worker`` as the docs show it (without its test extras)."""
    return ["dask", "worker", address, "--name", name, "--nthreads", "1", *_tls_flags(ca, leaf)]


def dask_client_env(ca: Path, leaf: Leaf) -> dict[str, str]:
    """Dask's settings for the driver's client certificate, as environment variables."""
    return {
        "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(ca),
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": str(leaf.cert),
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": str(leaf.key),
    }


def _installed(argv: list[str]) -> list[str]:
    return [str(BIN / argv[0]), *argv[1:]]


@contextmanager
def prefect_server(
    home: Path, auth_string: str, env: Mapping[str, str]
) -> Iterator[tuple[str, Process]]:
    """``prefect server start`` on a free port requiring ``auth_string``; its API URL, not
    waited for (it takes tens of seconds: the caller starts other things meanwhile)."""
    port = free_port()
    server_env = {k: v for k, v in env.items() if not k.startswith("PREFECT_")}
    server_env |= {
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_API_AUTH_STRING": auth_string,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
    }
    prefecthome.seed(home)
    proc = Process(_installed(prefect_argv("127.0.0.1", port)), server_env, home / "server.log")
    try:
        yield f"http://127.0.0.1:{port}/api", proc
    finally:
        proc.stop()


@contextmanager
def tls_scheduler(ca: Path, leaf: Leaf, env: Mapping[str, str], logs: Path) -> Iterator[str]:
    """``dask scheduler`` on a free loopback port over TLS; its ``tls://`` address."""
    port = free_port()
    proc = Process(
        _installed(scheduler_argv("127.0.0.1", port, ca, leaf)), env, logs / "scheduler.log"
    )
    try:
        deadline = time.monotonic() + 60
        while "Scheduler at:" not in proc.text():
            if not proc.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"dask scheduler did not start: {proc.text()[-3000:]}")
            time.sleep(0.2)
        yield f"tls://127.0.0.1:{port}"
    finally:
        proc.stop()


def dask_worker(
    address: str,
    name: str,
    env: Mapping[str, str],
    logs: Path,
    ca: Path | None,
    leaf: Leaf | None,
) -> Process:
    """One ``dask worker`` (nanny and worker) joining ``address`` with the given TLS files."""
    argv = _installed(worker_argv(address, name, ca, leaf))
    argv += ["--no-dashboard", "--local-directory", str(logs / f"dask-{name}")]
    return Process(argv, env, logs / f"worker-{name}.log")
