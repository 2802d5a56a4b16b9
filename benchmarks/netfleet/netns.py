"""The kernel's side of a fleet: the bridge, each host's namespace and veth pair, tbf, kills.

Every call is an ``ip`` or ``tc`` command (iproute2): the harness runs as
root and changes nothing but the names its session owns (:mod:`.session`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid

__all__ = [
    "add_bridge",
    "add_host",
    "cannot_make_namespaces",
    "delete_link",
    "delete_namespace",
    "kill_namespace",
    "link_names",
    "namespace_names",
    "namespace_pids",
    "set_link",
    "shape",
]


def ip(*args: str, check: bool = True) -> str:
    """``ip ARGS``'s output; a failure raises with ip's own message."""
    return _run("ip", *args, check=check)


def _run(*argv: str, check: bool = True) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def cannot_make_namespaces() -> str | None:
    """Why this machine cannot host a fleet (not root, no iproute2, no netns), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); this process is not root"
    for tool in ("ip", "tc", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2 / util-linux)"
    probe = f"vnfprobe{uuid.uuid4().hex[:6]}"
    try:
        ip("netns", "add", probe)
    except RuntimeError as exc:
        return f"cannot make a network namespace: {exc}"
    finally:
        ip("netns", "del", probe, check=False)
    return None


def add_bridge(name: str, address: str) -> None:
    """A bridge ``name`` holding ``address`` (CIDR) in the root namespace, up."""
    ip("link", "add", name, "type", "bridge")
    ip("addr", "add", address, "dev", name)
    ip("link", "set", name, "up")


def add_host(
    namespace: str, outer: str, inner: str, bridge: str, address: str, gateway: str
) -> None:
    """Namespace ``namespace``, its veth end ``inner`` at ``address`` (CIDR), ``outer`` bridged."""
    ip("netns", "add", namespace)
    ip("link", "add", outer, "type", "veth", "peer", "name", inner)
    ip("link", "set", inner, "netns", namespace)
    ip("link", "set", outer, "master", bridge, "up")
    ip("-n", namespace, "addr", "add", address, "dev", inner)
    ip("-n", namespace, "link", "set", inner, "up")
    ip("-n", namespace, "link", "set", "lo", "up")
    ip("-n", namespace, "route", "add", "default", "via", gateway)


def shape(namespace: str, outer: str, inner: str, mbit: float | None) -> None:
    """Cap both directions of a host's veth pair at ``mbit`` with tbf (None: remove the cap).

    ``outer``'s egress is what the host receives, ``inner``'s what it sends.
    The burst is 10 ms of the rate (at least 16 KiB, tbf refuses less than a
    packet and one tick); the queue holds 100 ms, beyond which tbf drops
    packets and TCP backs off, as behind a real bottleneck.
    """
    for prefix in ((), ("-n", namespace)):
        dev = inner if prefix else outer
        _run("tc", *prefix, "qdisc", "del", "dev", dev, "root", check=False)
        if mbit is None:
            continue
        rate = int(mbit * 1_000_000 / 8)  # bytes/s
        burst = max(rate // 100, 16 * 1024)
        limit = max(rate // 10, 4 * burst)
        _run(
            "tc", *prefix, "qdisc", "add", "dev", dev, "root", "tbf",
            "rate", f"{int(mbit * 1000)}kbit", "burst", str(burst), "limit", str(limit),
        )  # fmt: skip


def set_link(dev: str, up: bool) -> None:
    """Bring a root-namespace device up or down (a host's cable plugged or pulled)."""
    ip("link", "set", dev, "up" if up else "down")


def namespace_names() -> list[str]:
    """Every network namespace ``ip netns`` knows."""
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def link_names() -> list[str]:
    """Every network device of the root namespace."""
    names = []
    for line in ip("-o", "link", "show").splitlines():
        # "12: vnfab12h0@if11: <...>": the name, without the peer's index
        names.append(line.split(":", 2)[1].strip().split("@", 1)[0])
    return names


def namespace_pids(namespace: str) -> list[int]:
    """Every process in the network namespace."""
    out = ip("netns", "pids", namespace, check=False)
    return [int(p) for p in out.split()]


def kill_namespace(namespace: str, timeout: float = 10.0) -> list[int]:
    """SIGKILL every process in ``namespace`` at once, wait until they are gone; the pids."""
    pids = namespace_pids(namespace)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # A process forked between the listing and the kills: kill it too.
        left = namespace_pids(namespace)
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    return pids


def delete_namespace(namespace: str) -> None:
    """Kill what runs in ``namespace``, then delete it (its veth end and the peer go too)."""
    kill_namespace(namespace)
    ip("netns", "del", namespace, check=False)


def delete_link(name: str) -> None:
    """Delete a root-namespace device (bridge or veth); gone already is fine."""
    ip("link", "del", name, check=False)
