"""The namespaced fleet (benchmarks/netfleet/): links that delay, cap and cut; hosts that vanish.

Each test makes a small fleet (its namespaces, bridge and proxy: under a
second) and talks from a worker host to servers on the root namespace's
loopback, which a host reaches only through its link. Timings are read on
CLOCK_MONOTONIC, which the hosts' processes share with the test.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.netfleet import LinkProfile, netns, proxy, session
from tests.netfleetfixture import CLIENT, REPO, TcpServers, make_fleet, run_on, start_on
from tests.netfleetfixture import tcp_servers as tcp_servers  # the fixture

# Timings under a neighbour's load would lie (tests/lanes.py).
pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(120)]

CUT_S = 1.5


def _ours(sid: str) -> tuple[list[str], list[str]]:
    """The namespaces and devices of session ``sid`` that still exist."""
    prefix = f"{session.PREFIX}{sid}"
    return (
        [n for n in netns.namespace_names() if n.startswith(prefix)],
        [n for n in netns.link_names() if n.startswith(prefix)],
    )


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie (our own child, not yet reaped) is gone too.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_fleet_starts_reaches_services_only_over_links_and_leaves_nothing(
    tmp_path: Path, tcp_servers: TcpServers
) -> None:
    port = tcp_servers.port(tcp_servers.echo)
    with make_fleet(["a", "b"], tmp_path / "logs") as fleet:
        assert fleet.session is not None
        sid = fleet.session.sid
        spaces, devices = _ours(sid)
        assert len(spaces) == 2 and len(devices) == 3, (spaces, devices)  # a bridge, 2 veths
        sleeper = fleet.run("a", ["sleep", "300"], {"PATH": os.environ["PATH"]})
        gw, proxied = fleet.expose("echo", ("127.0.0.1", port))
        out = run_on(fleet, "b", CLIENT, "rtt", gw, str(proxied), "3")
        assert len(json.loads(out)) == 3
        # The root namespace's loopback is not the host's: the service itself is out of reach.
        code = "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 2)"
        proc, log = start_on(fleet, "b", code, str(port))
        assert proc.wait(30) != 0 and "ConnectionRefusedError" in log.read_text(), log.read_text()
        assert fleet.session.record.exists()
    assert _ours(sid) == ([], []), "namespaces or devices left"
    assert _gone(sleeper.pid), "a host's process outlived the fleet"
    assert not (session.REGISTRY / f"{sid}.json").exists()


_OWNER = """
import os, sys, time
from pathlib import Path
from benchmarks.netfleet import Fleet
fleet = Fleet(["a"], Path(sys.argv[1]))
fleet.start()
env = {"PATH": os.environ["PATH"]}
host = fleet.run("a", ["sleep", "300"], env)
root = fleet.run_root(["sleep", "300"], env, "root-sleep")
print(fleet.session.sid, host.pid, root.pid, flush=True)
time.sleep(300)
"""


def test_a_killed_owner_leaves_nothing_once_the_next_fleet_starts(tmp_path: Path) -> None:
    make_fleet(["x"], tmp_path)  # skips where namespaces cannot be made
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(tmp_path / "logs")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None
    sid, host_pid, root_pid = owner.stdout.readline().split()
    assert _ours(sid)[0], "the owner made no namespace"
    owner.send_signal(signal.SIGKILL)
    owner.wait(10)
    # The kernel ended the owner's processes (parent-death signal) ...
    deadline = time.monotonic() + 5
    while not all(_gone(int(p)) for p in (host_pid, root_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(int(p)) for p in (host_pid, root_pid))
    # ... its namespaces and devices stay until the next fleet starts.
    assert _ours(sid) != ([], [])
    with make_fleet(["y"], tmp_path / "next") as fleet:
        assert _ours(sid) == ([], []), "the next fleet did not remove the dead session's"
        assert fleet.session is not None and fleet.session.sid != sid
    assert not (session.REGISTRY / f"{sid}.json").exists()


def test_latency_profile_adds_its_round_trip(tmp_path: Path, tcp_servers: TcpServers) -> None:
    profiles = {"slow": LinkProfile(latency_ms=60, jitter_ms=10)}
    with make_fleet(["slow", "fast"], tmp_path, profiles) as fleet:
        gw, port = fleet.expose("echo", ("127.0.0.1", tcp_servers.port(tcp_servers.echo)))
        slow = json.loads(run_on(fleet, "slow", CLIENT, "rtt", gw, str(port), "20"))
        fast = json.loads(run_on(fleet, "fast", CLIENT, "rtt", gw, str(port), "20"))
    print(
        f"echo RTT ms: 60+-10 ms link median {statistics.median(slow):.1f} "
        f"(min {min(slow):.1f}, max {max(slow):.1f}); unshaped {statistics.median(fast):.1f}"
    )
    # Each direction holds 30 ms +- 5: a round trip is 60 +- 10 ms, plus the proxy's own.
    assert min(slow) >= 50 and statistics.median(slow) >= 60, slow
    assert statistics.median(slow) < 90, slow
    assert statistics.median(fast) < 10, fast


def test_bandwidth_is_capped_by_tbf_both_ways(tmp_path: Path, tcp_servers: TcpServers) -> None:
    mbit, size = 20, 2_500_000  # 1 s each way at the cap
    with make_fleet(["h"], tmp_path, {"h": LinkProfile(mbit=mbit)}) as fleet:
        gw, port = fleet.expose("source", ("127.0.0.1", tcp_servers.port(tcp_servers.source)))
        down = json.loads(run_on(fleet, "h", CLIENT, "bytes", gw, str(port), str(size), "down"))
        up = json.loads(run_on(fleet, "h", CLIENT, "bytes", gw, str(port), str(size), "up"))
        fleet.set_profile("h", LinkProfile())
        free = json.loads(run_on(fleet, "h", CLIENT, "bytes", gw, str(port), str(size), "down"))
    rates = {k: v["bytes"] * 8 / v["seconds"] / 1e6 for k, v in (("down", down), ("up", up))}
    print(
        f"Mbit/s at a {mbit} Mbit/s cap: {rates}; uncapped {size * 8 / free['seconds'] / 1e6:.0f}"
    )
    assert down["bytes"] == up["bytes"] == size
    for way, rate in rates.items():
        assert 0.6 * mbit <= rate <= 1.15 * mbit, (way, rate)
    assert size * 8 / free["seconds"] / 1e6 > 3 * mbit


def _probe_through_cut(
    tmp_path: Path, servers: TcpServers, mode: str
) -> tuple[float, list[list[float]], list[list[Any]]]:
    """A host's echoes for CUT_S + 2.5 s, its link cut once they run: (cut at, echoes, errors)."""
    with make_fleet(["h"], tmp_path, {"h": LinkProfile(latency_ms=10)}) as fleet:
        gw, port = fleet.expose("echo", ("127.0.0.1", servers.port(servers.echo)))
        proc, log = start_on(fleet, "h", CLIENT, "probe", gw, str(port), str(CUT_S + 2.5))
        deadline = time.monotonic() + 30
        while "open" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.02)
        time.sleep(0.3)
        cut_at = time.monotonic()
        fleet.cut("h", CUT_S, mode)  # type: ignore[arg-type]
        assert proc.wait(30) == 0, log.read_text()
        result = json.loads(log.read_text().splitlines()[-1])
    return cut_at, result["echoes"], result["errors"]


def test_reset_cut_refuses_for_its_time_then_works(tmp_path: Path, tcp_servers: TcpServers) -> None:
    cut_at, echoes, errors = _probe_through_cut(tmp_path, tcp_servers, "reset")
    assert errors and errors[0][0] >= cut_at, errors  # the open connection was reset
    during = [e for e in echoes if cut_at + 0.05 < e[1] < cut_at + CUT_S - 0.05]
    assert during == [], during  # nothing got through while cut
    after = [e for e in echoes if e[0] >= cut_at]
    assert after and after[0][1] >= cut_at + CUT_S, after[:3]
    assert after[0][1] < cut_at + CUT_S + 1.0, after[:3]  # and it works again at once
    print(f"reset: {len(errors)} refusals, back {after[0][1] - cut_at:.2f}s after the cut")


def test_stall_cut_holds_traffic_then_delivers(tmp_path: Path, tcp_servers: TcpServers) -> None:
    cut_at, echoes, errors = _probe_through_cut(tmp_path, tcp_servers, "stall")
    assert errors == [], errors  # held, not refused: the connection lives
    held = max(end - start for start, end in echoes)
    assert CUT_S - 0.35 <= held < CUT_S + 1.0, held  # it started <= 0.35 s after the cut
    assert any(start > cut_at + CUT_S for start, _ in echoes), "no echo after the cut"
    print(f"stall: one echo held {held:.2f}s, {len(echoes)} echoes in all")


def test_down_cut_drops_every_packet_then_tcp_recovers(
    tmp_path: Path, tcp_servers: TcpServers
) -> None:
    _, echoes, errors = _probe_through_cut(tmp_path, tcp_servers, "down")
    assert errors == [], errors
    held = max(end - start for start, end in echoes)
    # TCP retransmits on its own schedule (200 ms, doubling): back some time after.
    assert CUT_S - 0.35 <= held < CUT_S + 3.0, held
    print(f"down: one echo held {held:.2f}s by TCP's retransmissions")


def test_a_down_cut_past_the_keepalive_resets_the_far_side(
    tmp_path: Path, tcp_servers: TcpServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Dask's keepalive gives up on a silent peer after 30 s; scaled down here to
    # 2 + 3 x 1 s. An idle connection: no byte sent, only the probes find the cut.
    monkeypatch.setattr(
        proxy, "KEEPALIVE", {"TCP_KEEPIDLE": 2, "TCP_KEEPINTVL": 1, "TCP_KEEPCNT": 3}
    )
    code = (
        "import socket,sys,time; s=socket.create_connection((sys.argv[1],int(sys.argv[2])));"
        "s.sendall(b'x'); s.recv(1); print('open',flush=True); time.sleep(60)"
    )
    with make_fleet(["a"], tmp_path) as fleet:
        assert fleet.proxy is not None
        gw, port = fleet.expose("echo", ("127.0.0.1", tcp_servers.port(tcp_servers.echo)))
        _, log = start_on(fleet, "a", code, gw, str(port))
        deadline = time.monotonic() + 30
        while "open" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        route = fleet.proxy.routes["echo"]
        assert len(route.connections) == 1
        cut_at = time.monotonic()
        fleet.cut("a", 12, "down")
        while route.connections and time.monotonic() < cut_at + 11:
            time.sleep(0.1)
        gone = time.monotonic() - cut_at
    # Reset during the cut, about when the host's own probes would give up: not held to its end.
    assert not route.connections and gone < 11, gone
    print(f"down: the idle connection reset {gone:.1f}s into a 12-s cut (keepalive 5 s)")


def test_a_vanished_host_has_no_process_left(tmp_path: Path) -> None:
    with make_fleet(["gone", "stays"], tmp_path) as fleet:
        env = {"PATH": os.environ["PATH"]}
        tree = fleet.run("gone", ["sh", "-c", "sleep 300 & sleep 300 & wait"], env)
        other = fleet.run("stays", ["sleep", "300"], env)
        ns = fleet.hosts["gone"].namespace
        deadline = time.monotonic() + 10
        while len(netns.namespace_pids(ns)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        before = netns.namespace_pids(ns)
        assert len(before) == 3, before  # the shell and its two sleeps
        killed = fleet.vanish("gone")
        assert sorted(killed) == sorted(before)
        assert netns.namespace_pids(ns) == []
        assert all(_gone(pid) for pid in before) and tree.returncode == -signal.SIGKILL
        assert other.poll() is None, "the other host's process went too"


_READ = """
import json, os, sys
def read(p):
    try:
        with open(p) as f:
            return f.read()
    except OSError as exc:
        return type(exc).__name__
mine = "/tmp/host-own-file"
if sys.argv[1] == "write":
    with open(mine, "w") as f:
        f.write("mine")
print(json.dumps({p: read(p) for p in [*sys.argv[2:], mine]}))
"""


def test_a_worker_host_cannot_read_the_drivers_home(tmp_path: Path) -> None:
    home = tmp_path / "home"  # the driver's --home, as a test's run has it
    home.mkdir()
    (home / "weights.safetensors").write_text("driver's")
    in_home = Path.home() / f".netfleet-probe-{os.getpid()}"  # the driver's $HOME
    in_home.write_text("driver's")
    try:
        with make_fleet(["a", "b"], tmp_path / "logs") as fleet:
            paths = [str(home / "weights.safetensors"), str(in_home)]
            a = json.loads(run_on(fleet, "a", _READ, "write", *paths))
            b = json.loads(run_on(fleet, "b", _READ, "read", *paths))
    finally:
        in_home.unlink()
    for path in paths:
        assert a[path] == b[path] == "FileNotFoundError", (a, b)
    # Each host has a /tmp of its own, which the driver does not see either.
    assert a["/tmp/host-own-file"] == "mine"
    assert b["/tmp/host-own-file"] == "FileNotFoundError"
    assert not Path("/tmp/host-own-file").exists()
