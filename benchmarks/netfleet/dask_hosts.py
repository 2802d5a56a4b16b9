"""Dask on a fleet: the scheduler in the root namespace, one ``dask worker`` per host.

The scheduler listens on loopback, as beside the driver on an on-demand
machine; the hosts reach it through the proxy at the bridge's address. Each
worker listens on its host's own address and advertises a proxied address
(``--contact-address``), so what the scheduler, the driver's client and the
other workers send to it crosses its link as well. The nanny is not proxied
(``dask worker`` has no contact address for it): the scheduler's few calls
to it cross the veth, shaped by tbf, without the proxy's delays.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks.netfleet.fleet import Fleet

__all__ = ["WORKER_PORT", "start_scheduler", "start_worker", "wait_for_port"]

BIN = Path(sys.executable).parent
# Each host has a port space of its own: every worker can listen on the same one.
WORKER_PORT = 40001
NANNY_PORT = 40002


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(
    host: str, port: int, proc: subprocess.Popen[bytes], timeout: float, what: str
) -> None:
    """Until ``host:port`` listens; raise naming ``what`` if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode}")
        with socket.socket() as s:
            s.settimeout(1)
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{what}: nothing listens on {host}:{port} after {timeout:.0f}s")


def start_scheduler(
    fleet: Fleet, env: Mapping[str, str], timeout: float = 60, tls: Sequence[str] = ()
) -> str:
    """``dask scheduler`` on loopback, carried to the hosts; the address every side uses.

    ``tls``: the scheduler's ``--tls-*`` options; given, it speaks only TLS
    (``tls://``), which the proxy carries as it carries any TCP stream.
    """
    port = _free_port()
    protocol = ["--protocol", "tls", *tls] if tls else []
    proc = fleet.run_root(
        [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
         "--no-dashboard", *protocol],
        env,
        "scheduler",
    )  # fmt: skip
    wait_for_port("127.0.0.1", port, proc, timeout, "dask scheduler")
    host, proxied = fleet.expose("scheduler", ("127.0.0.1", port))
    return f"{'tls' if tls else 'tcp'}://{host}:{proxied}"


def start_worker(
    fleet: Fleet,
    host: str,
    scheduler: str,
    env: Mapping[str, str],
    options: Sequence[str] = ("--nthreads", "1"),
) -> subprocess.Popen[bytes]:
    """One ``dask worker`` (a nanny and its worker) on ``host``, named after it.

    It listens with the scheduler's protocol (``tls://`` takes its ``--tls-*``
    files in ``options``).
    """
    h = fleet.hosts[host]
    scheme = scheduler.split("://", 1)[0] if "://" in scheduler else "tcp"
    contact_host, contact_port = fleet.expose_host_port(host, WORKER_PORT)
    argv = [
        str(BIN / "dask"), "worker", scheduler,
        "--nworkers", "1", "--no-dashboard", "--name", host,
        "--listen-address", f"{scheme}://{h.address}:{WORKER_PORT}",
        "--contact-address", f"{scheme}://{contact_host}:{contact_port}",
        "--nanny-port", str(NANNY_PORT),
        "--local-directory", "/tmp/dask",  # the host's own tmpfs
        *options,
    ]  # fmt: skip
    return fleet.run(host, argv, env, log=f"worker-{host}")
