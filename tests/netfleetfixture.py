"""Fixtures of the namespaced fleet (benchmarks/netfleet/): where it can run, and small servers.

Where namespaces cannot be made (not root, no iproute2) a test that needs the
fleet skips with the reason; under ``CI=true`` it fails instead, since CI
runs as root on a machine that has them (as with PostgreSQL and moto).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import socketserver
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from benchmarks.netfleet import Fleet, LinkProfile
from benchmarks.netfleet.netns import cannot_make_namespaces

__all__ = ["CLIENT", "TcpServers", "make_fleet", "run_on", "start_on", "tcp_servers"]

REPO = Path(__file__).resolve().parent.parent


def make_fleet(
    hosts: Sequence[str], logs: Path, profiles: dict[str, LinkProfile] | None = None
) -> Fleet:
    """A fleet not yet started; skips (fails under CI=true) where namespaces cannot be made."""
    reason = cannot_make_namespaces()
    if reason:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason} (CI=true: the fleet tests must run)", pytrace=False)
        pytest.skip(reason)
    return Fleet(hosts, logs, profiles, cwd=str(REPO))


def start_on(
    fleet: Fleet, host: str, code: str, *args: str
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start Python ``code`` with ``args`` on ``host``; the process and its output's file."""
    name = f"py-{uuid.uuid4().hex[:8]}"
    argv = [sys.executable, "-c", code, *args]
    proc = fleet.run(host, argv, {"PATH": os.environ["PATH"]}, log=name)
    return proc, fleet.logs / f"{name}.log"


def run_on(fleet: Fleet, host: str, code: str, *args: str, timeout: float = 60) -> str:
    """Run Python ``code`` with ``args`` on ``host``; what it printed (it must exit 0)."""
    proc, log = start_on(fleet, host, code, *args)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    out = log.read_text(errors="replace")
    assert proc.returncode == 0, out
    return out


# What a host runs against the servers below (plain Python, nothing of ours):
#   rtt ADDR PORT N             N 64-byte echoes on one connection: their times (ms)
#   bytes ADDR PORT N down|up   N bytes from or to the source: seconds
#   probe ADDR PORT SECONDS     echoes for SECONDS, reconnecting after errors: every
#                               echo's start and end and every error (monotonic s)
CLIENT = r"""
import json, socket, sys, time
cmd, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
def conn():
    return socket.create_connection((addr, port), timeout=15)
def echo(s):
    s.sendall(b"p" * 64)
    got = b""
    while len(got) < 64:
        chunk = s.recv(64 - len(got))
        if not chunk:
            raise ConnectionError("closed")
        got += chunk
if cmd == "rtt":
    s = conn()
    echo(s)
    out = []
    for _ in range(int(sys.argv[4])):
        t = time.monotonic(); echo(s); out.append((time.monotonic() - t) * 1000)
    print(json.dumps(out))
elif cmd == "bytes":
    n, way = int(sys.argv[4]), sys.argv[5]
    s = conn(); t = time.monotonic()
    if way == "down":
        s.sendall(n.to_bytes(8, "big")); got = 0
        while got < n:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += len(chunk)
    else:
        s.sendall((0).to_bytes(8, "big")); s.sendall(b"x" * n); s.shutdown(socket.SHUT_WR)
        got = int(s.recv(64))
    print(json.dumps({"bytes": got, "seconds": time.monotonic() - t}))
elif cmd == "probe":
    s = conn(); echo(s)
    print("open", flush=True)
    end = time.monotonic() + float(sys.argv[4]); echoes, errors = [], []
    while time.monotonic() < end:
        t = time.monotonic()
        try:
            if s is None:
                s = conn()
            echo(s); echoes.append((t, time.monotonic()))
        except OSError as exc:
            errors.append((time.monotonic(), type(exc).__name__)); s = None
        time.sleep(0.05)
    print(json.dumps({"echoes": echoes, "errors": errors}))
"""


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        # A cut link resets the connection: the end of it, not an error here.
        with contextlib.suppress(ConnectionError):
            while data := self.request.recv(65536):
                self.request.sendall(data)


class _Source(socketserver.BaseRequestHandler):
    """Reads an 8-byte count: sends that many bytes (download); reads a count of 0 then
    everything up to EOF, answering its size (upload)."""

    def handle(self) -> None:
        with contextlib.suppress(ConnectionError):
            self._serve()

    def _serve(self) -> None:
        count = int.from_bytes(_recv_exactly(self.request, 8), "big")
        if count:
            self.request.sendall(b"x" * count)
            return
        total = 0
        while data := self.request.recv(65536):
            total += len(data)
        self.request.sendall(json.dumps(total).encode())


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed early")
        buf += chunk
    return buf


class TcpServers:
    """An echo and a byte source on the root namespace's loopback: the hosts reach them only
    through the fleet's proxy."""

    def __init__(self) -> None:
        socketserver.ThreadingTCPServer.daemon_threads = True
        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.echo = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
        self.source = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Source)
        for server in (self.echo, self.source):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    @staticmethod
    def port(server: socketserver.TCPServer) -> int:
        return int(server.server_address[1])

    def close(self) -> None:
        for server in (self.echo, self.source):
            server.shutdown()
            server.server_close()


@pytest.fixture
def tcp_servers() -> Iterator[TcpServers]:
    servers = TcpServers()
    try:
        yield servers
    finally:
        servers.close()
