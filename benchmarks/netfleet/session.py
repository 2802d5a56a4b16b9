"""Whose namespaces are whose: a session's names, its subnet, and the clean-up of dead sessions.

A fleet's session holds a short random id; every namespace (``vnf<id>-<host>``)
and device (``vnf<id>br``, ``vnf<id>h<i>``) it makes carries it, and a file
``/run/vcdl-netfleet/<id>.json`` names the owner process (pid and start
time, so a reused pid is not taken for it), its subnet ``10.77.<x>.0/24``
and the root-namespace processes it started. A session whose owner is gone
(SIGKILLed, say) is removed by the next session that starts: its processes,
namespaces and devices. Sessions are claimed under a file lock, so two that
start at once never pick the same id or subnet.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import re
import secrets
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.netfleet import netns

__all__ = ["PREFIX", "REGISTRY", "Session", "claim", "end", "remove_stale"]

PREFIX = "vnf"  # every name a fleet makes starts with it (devices allow 15 characters)
REGISTRY = Path("/run/vcdl-netfleet")
_NAME = re.compile(rf"^{PREFIX}([0-9a-f]{{5}})(?:-|br$|h\d+$|p\d+$)")


@dataclass(frozen=True)
class Session:
    """One fleet's names: id ``sid``, subnet ``10.77.<subnet>.0/24``."""

    sid: str
    subnet: int

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.sid}br"

    @property
    def gateway(self) -> str:
        """The bridge's address: where the root namespace (driver, services) is reached."""
        return f"10.77.{self.subnet}.1"

    def namespace(self, host: str) -> str:
        return f"{PREFIX}{self.sid}-{host}"

    def veth(self, index: int) -> tuple[str, str]:
        """(root-namespace end, host end) of host ``index``'s veth pair."""
        return f"{PREFIX}{self.sid}h{index}", f"{PREFIX}{self.sid}p{index}"

    def address(self, index: int) -> str:
        return f"10.77.{self.subnet}.{10 + index}"

    @property
    def record(self) -> Path:
        return REGISTRY / f"{self.sid}.json"

    def add_process(self, pid: int) -> None:
        """Remember a root-namespace process, so a next session can end it if this one dies."""
        with _locked():
            data = json.loads(self.record.read_text())
            data["pids"].append([pid, _started(pid)])
            self.record.write_text(json.dumps(data))

    def release(self) -> None:
        """Forget the session (after its namespaces, devices and processes are gone)."""
        with _locked():
            self.record.unlink(missing_ok=True)


def _started(pid: int) -> str:
    """The process's start time (``/proc/PID/stat`` field 22); '' when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, started: str) -> bool:
    return bool(started) and _started(pid) == started


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    REGISTRY.mkdir(parents=True, exist_ok=True)
    with open(REGISTRY / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _records() -> dict[str, dict[str, object]]:
    out = {}
    for path in REGISTRY.glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            out[path.stem] = json.loads(path.read_text())
    return out


def _remove(sid: str, record: dict[str, object] | None) -> None:
    pids = record.get("pids", []) if record else []
    for pid, started in pids:  # type: ignore[attr-defined]
        if _alive(int(pid), str(started)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    for name in netns.namespace_names():
        if name.startswith(f"{PREFIX}{sid}-"):
            netns.delete_namespace(name)
    for name in netns.link_names():
        if name.startswith(f"{PREFIX}{sid}"):
            netns.delete_link(name)
    (REGISTRY / f"{sid}.json").unlink(missing_ok=True)


def _live(records: dict[str, dict[str, object]]) -> set[str]:
    return {
        sid
        for sid, r in records.items()
        if _alive(int(r.get("owner", 0)), str(r.get("started", "")))  # type: ignore[call-overload]
    }


def remove_stale() -> list[str]:
    """Remove every session whose owner is dead, and names of ours no live session owns; the ids."""
    with _locked():
        records = _records()
        live = _live(records)
        names = netns.namespace_names() + netns.link_names()
        found = {m.group(1) for n in names if (m := _NAME.match(n))}
        stale = sorted((found | set(records)) - live)
        for sid in stale:
            _remove(sid, records.get(sid))
    return stale


def end(session: Session) -> None:
    """Remove everything ``session`` made: its root-namespace processes, namespaces, devices."""
    with _locked():
        _remove(session.sid, _records().get(session.sid))


def claim() -> Session:
    """A new session for this process: stale ones removed first, a free id and subnet."""
    remove_stale()
    with _locked():
        records = _records()
        used_ids = set(records)
        used_nets = {int(r.get("subnet", -1)) for r in records.values()}  # type: ignore[call-overload]
        addresses = netns.ip("-o", "-4", "addr", "show")
        used_nets |= {int(x) for x in re.findall(r"inet 10\.77\.(\d+)\.", addresses)}
        free = [x for x in range(1, 255) if x not in used_nets]
        if not free:
            raise RuntimeError("no free 10.77.x.0/24 subnet for a fleet")
        sid = secrets.token_hex(3)[:5]
        while sid in used_ids:
            sid = secrets.token_hex(3)[:5]
        session = Session(sid, random.choice(free))
        record = {"owner": os.getpid(), "started": _started(os.getpid()), "subnet": session.subnet}
        session.record.write_text(json.dumps({**record, "pids": []}))
    return session
