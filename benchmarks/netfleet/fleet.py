"""A fleet of hosts on this machine: namespaces on a bridge, links through the proxy, and their end.

:class:`Fleet` puts the pieces together: a session (:mod:`.session`), a
bridge and one namespace per worker host (:mod:`.netns`), the proxy that
carries every service to the hosts (:mod:`.proxy`), and the processes on
each host (:mod:`.hosts`). The root namespace is the driver's and services'
side, reached from the hosts at the bridge's address (``fleet.gateway``).

Everything it made goes when it closes: on ``with`` exit, at interpreter
exit (atexit), on SIGTERM where nobody else handles it (it raises
SystemExit so the ``with`` unwinds), and, when the owner was SIGKILLed, at
the next fleet's start (:func:`.session.remove_stale`); its processes also
get SIGKILL from the kernel when the owner dies (``setpriv --pdeathsig``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO
from urllib.parse import urlsplit

from benchmarks.netfleet import netns, session
from benchmarks.netfleet.hosts import host_command
from benchmarks.netfleet.links import CutMode, LinkProfile
from benchmarks.netfleet.proxy import DRIVER, LinkProxy

__all__ = ["DRIVER", "Fleet", "Host"]


@dataclass
class Host:
    """A worker host: its namespace, address, veth pair, and the processes started there."""

    name: str
    index: int
    namespace: str
    address: str
    outer: str
    inner: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)


class Fleet:
    """``hosts`` worker hosts on a private bridge; use as ``with Fleet([...]) as fleet:``."""

    def __init__(
        self,
        hosts: Sequence[str],
        logs: Path,
        profiles: Mapping[str, LinkProfile] | None = None,
        hidden: Sequence[str] | None = None,
        kept: Sequence[str] | None = None,
        cwd: str | None = None,
    ) -> None:
        """``logs``: a folder for each process's output; ``profiles``: link name → profile
        (a host's name, or ``driver``); ``hidden``/``kept``/``cwd``: see :mod:`.hosts`."""
        if len(set(hosts)) != len(hosts) or DRIVER in hosts:
            raise ValueError(f"host names must be distinct and not {DRIVER!r}: {hosts}")
        self.names = list(hosts)
        self.logs = logs
        self.profiles = dict(profiles or {})
        self.hidden, self.kept = hidden, kept
        self.cwd = cwd or os.getcwd()
        self.hosts: dict[str, Host] = {}
        self.session: session.Session | None = None
        self.proxy: LinkProxy | None = None
        self._root_procs: list[subprocess.Popen[bytes]] = []
        self._files: list[IO[bytes]] = []
        self._timers: list[threading.Timer] = []
        self._by_address: dict[str, str] = {}
        self._closed = False

    # -- life ----------------------------------------------------------------------------

    def __enter__(self) -> Fleet:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> None:
        """Make the bridge, the hosts and their links (stale sessions removed first)."""
        reason = netns.cannot_make_namespaces()
        if reason:
            raise PermissionError(reason)
        self.logs.mkdir(parents=True, exist_ok=True)
        atexit.register(self.close)
        _raise_on_sigterm()
        self.session = s = session.claim()
        netns.add_bridge(s.bridge, f"{s.gateway}/24")
        self.proxy = LinkProxy(lambda ip: self._by_address.get(ip, DRIVER))
        self.proxy.add_link(DRIVER, self.profiles.get(DRIVER))
        for index, name in enumerate(self.names):
            outer, inner = s.veth(index)
            host = Host(name, index, s.namespace(name), s.address(index), outer, inner)
            netns.add_host(host.namespace, outer, inner, s.bridge, f"{host.address}/24", s.gateway)
            self.hosts[name] = host
            self._by_address[host.address] = name
            self.proxy.add_link(name)
            self.set_profile(name, self.profiles.get(name, LinkProfile()))

    def close(self) -> None:
        """Kill every process the fleet started, remove its namespaces and devices. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for timer in self._timers:
            timer.cancel()
        for host in self.hosts.values():
            netns.kill_namespace(host.namespace)
        for proc in self._root_procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in [*self._root_procs, *(p for h in self.hosts.values() for p in h.procs)]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        if self.proxy is not None:
            self.proxy.close()
        if self.session is not None:
            session.end(self.session)
        for f in self._files:
            f.close()
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)

    # -- addresses -----------------------------------------------------------------------

    @property
    def gateway(self) -> str:
        """The bridge's address: the root namespace as the hosts see it."""
        assert self.session is not None, "the fleet is not started"
        return self.session.gateway

    def expose(self, name: str, target: tuple[str, int]) -> tuple[str, int]:
        """Carry a root-namespace service at ``target`` to the hosts; its (gateway, port).

        The driver reaches it there too, over the ``driver`` link.
        """
        assert self.proxy is not None
        return self.proxy.add_route(name, self.gateway, target)

    def expose_url(self, name: str, url: str) -> str:
        """``url`` (``http://127.0.0.1:9000``, ``postgresql://u@127.0.0.1:5432/db?...``) as the
        hosts reach it: its host and port replaced by the proxy's."""
        parts = urlsplit(url)
        assert parts.hostname and parts.port, url
        host, port = self.expose(name, (parts.hostname, parts.port))
        auth = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        return parts._replace(netloc=f"{auth}{host}:{port}").geturl()

    def expose_host_port(self, host: str, port: int) -> tuple[str, int]:
        """A host's ``port``, reached from the root namespace (and other hosts) over its link."""
        assert self.proxy is not None
        h = self.hosts[host]
        return self.proxy.add_route(f"{host}:{port}", self.gateway, (h.address, port), into=host)

    # -- processes -----------------------------------------------------------------------

    def _log(self, name: str) -> IO[bytes]:
        f = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115  (closed in close())
        self._files.append(f)
        return f

    def run(
        self, host: str, argv: Sequence[str], env: Mapping[str, str], log: str | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` on ``host`` (its network, its own /tmp, the driver's files hidden)."""
        h = self.hosts[host]
        cmd = host_command(h.namespace, argv, self.cwd, self.hidden, self.kept)
        out = self._log(log or host)
        proc = subprocess.Popen(
            cmd, env=dict(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        h.procs.append(proc)
        return proc

    def run_root(
        self, argv: Sequence[str], env: Mapping[str, str], log: str
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in the root namespace (a service: the scheduler), ended with the fleet."""
        assert self.session is not None
        proc = subprocess.Popen(
            ["setpriv", "--pdeathsig", "KILL", "--", *argv],
            env=dict(env),
            cwd=self.cwd,
            stdout=self._log(log),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._root_procs.append(proc)
        self.session.add_process(proc.pid)
        return proc

    # -- faults --------------------------------------------------------------------------

    def set_profile(self, link: str, profile: LinkProfile) -> None:
        """A link's profile from now on: latency, jitter, loss in the proxy, bandwidth by tbf.

        The ``driver`` link has no veth: its bandwidth is not shaped.
        """
        assert self.proxy is not None
        self.proxy.set_profile(link, profile)
        self.profiles[link] = profile
        if link != DRIVER:
            h = self.hosts[link]
            netns.shape(h.namespace, h.outer, h.inner, profile.mbit)

    def cut(self, link: str, seconds: float, mode: CutMode = "stall") -> None:
        """Cut ``link`` for ``seconds``, returning at once; it comes back by itself.

        ``stall``: the proxy holds its traffic and new connections (they go on
        after); ``reset``: its connections are reset and new ones reset at
        once; ``down``: a host's veth goes down as well (every packet of the
        host dropped, peer traffic too; TCP retransmits), with the proxy's stall.
        ``link`` may name one route of a link, ``proxy.route_link("driver", "s3")``:
        only that side's connections to that service are cut (``stall`` or ``reset``).
        """
        assert self.proxy is not None
        if mode == "down" and (link == DRIVER or ">" in link):
            raise ValueError(f"{link!r} has no veth to take down: cut it with stall or reset")
        self.proxy.cut(link, seconds, "stall" if mode == "down" else mode)
        if mode == "down":
            dev = self.hosts[link].outer
            netns.set_link(dev, up=False)
            timer = threading.Timer(seconds, netns.set_link, (dev, True))
            timer.daemon = True
            timer.start()
            self._timers.append(timer)

    def vanish(self, host: str) -> list[int]:
        """SIGKILL every process on ``host`` at once, as when a spot VM is taken; the pids."""
        h = self.hosts[host]
        pids = netns.kill_namespace(h.namespace)
        for proc in h.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        return pids

    def carried(self, link: str) -> dict[str, int]:
        """Bytes the proxy carried over ``link`` so far, by route (both directions)."""
        assert self.proxy is not None
        return dict(self.proxy.links[link].carried)


def _raise_on_sigterm() -> None:
    # Python's default SIGTERM ends the process without unwinding: no
    # finalizer, no atexit. Where nobody installed a handler, make it unwind.
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)
