"""Issue 50 item 5: the link to a PostgreSQL ledger goes silent in the middle of a call.

A silent link is one that drops every packet and answers none: no reset, no
refusal. The proxy's ``reset`` cut (tests/integration/test_partition.py) is
not one, and neither is its ``stall``: a client's TCP peer is then the
proxy's kernel, which acknowledges data and answers keepalive probes however
long the proxy holds the bytes. So the ledger client runs on a host of the
namespaced fleet (benchmarks/netfleet/), and the cut is ``down``: the host's
veth goes down and every packet it sends or should receive is dropped, while
the proxy holds what it had. No firewall is needed (this machine has neither
iptables nor nft).

The call is a statement in flight (``pg_sleep``) when the link goes down. With
vcdl's TCP keepalives and ``tcp_user_timeout`` (vcdl/ledger/pgsession.py) the
client's kernel ends the connection about 20 s after the last packet that came
back, instead of waiting for the link; the retry policy (vcdl/ledger/retry.py)
then raises a call that may not be repeated, or reconnects and runs it again.
Without them the call below would wait until the link came back.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.netfleetfixture import make_fleet

pytestmark = pytest.mark.slow

# On the host: open the ledger, answer once, say so, then run one call whose
# statement is still running on the server when the link goes down. Prints JSON
# lines: ready, the vcdl.transient log lines, and the outcome (monotonic seconds;
# one clock for every namespace of the machine).
CHILD = r"""
import json, logging, sys, time
from vcdl.ledger.engine import LedgerEngine

class Lines(logging.Handler):
    def emit(self, record):
        print(json.dumps({"log": record.getMessage(), "at": time.monotonic()}), flush=True)

logging.getLogger("vcdl.transient").addHandler(Lines())
logging.getLogger("vcdl.transient").setLevel(logging.INFO)
url, how = sys.argv[1], sys.argv[2]
engine = LedgerEngine(url)
engine.ensure_schema()
engine.read(lambda c: c.exec_driver_sql("SELECT 1").scalar())
print(json.dumps({"ready": time.monotonic()}), flush=True)
call = engine.single if how == "single" else engine.read
began = time.monotonic()
try:
    value = call(lambda c: c.exec_driver_sql("SELECT pg_sleep(2), 7").one()[1])
    print(json.dumps({"value": value, "began": began, "ended": time.monotonic()}), flush=True)
except Exception as exc:
    out = {"error": f"{type(exc).__name__}: {exc}", "began": began, "ended": time.monotonic()}
    print(json.dumps(out), flush=True)
"""


def _lines(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def _call_through_a_silent_link(
    pg_url: str, tmp_path: Path, how: str, cut_s: float, env: dict[str, str]
) -> tuple[float, list[dict[str, Any]]]:
    """Run CHILD on a fleet host, take its link down once the call is on its way: the
    cut's start and what the child printed."""
    with make_fleet(["h"], tmp_path / "logs") as fleet:
        url = fleet.expose_url("ledger", pg_url)
        log = fleet.logs / "child.log"
        proc = fleet.run(
            "h",
            [sys.executable, "-c", CHILD, url, how],
            {"PATH": os.environ["PATH"], **env},
            "child",
        )
        deadline = time.monotonic() + 60
        while not any("ready" in line for line in _lines(log)):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        time.sleep(0.5)  # the statement was sent and acknowledged; its reply is 1.5 s away
        cut_at = time.monotonic()
        fleet.cut("h", cut_s, "down")
        try:
            proc.wait(60)
        except BaseException:
            proc.kill()
            raise
        return cut_at, _lines(log)


def test_a_call_on_a_silent_link_fails_within_the_default_bound(
    pg_url: str, tmp_path: Path
) -> None:
    """Default settings; a one-statement autocommit call, which may not be repeated once
    sent (its write may have been applied), so the lost connection is raised."""
    cut_at, lines = _call_through_a_silent_link(pg_url, tmp_path, "single", 45.0, {})
    outcome = lines[-1]
    assert "error" in outcome, lines
    detected = outcome["ended"] - cut_at
    print(f"default settings: the silent link was detected after {detected:.1f} s")
    # The kernel ends the connection 20 s after the last packet that came back
    # (tcp_user_timeout, at a keepalive probe), not when the link returns (45 s).
    assert 15 <= detected <= 30, (detected, lines)
    assert "timed out" in outcome["error"].lower() or "connection" in outcome["error"], outcome


def test_a_read_on_a_silent_link_reconnects_after_it_returns(pg_url: str, tmp_path: Path) -> None:
    """Shorter bounds from the environment (the overrides work on a real link); a read is
    run again on a new connection once the link is back, logged once each way."""
    env = {
        "VCDL_LEDGER_KEEPALIVES_IDLE": "2",
        "VCDL_LEDGER_KEEPALIVES_INTERVAL": "1",
        "VCDL_LEDGER_TCP_USER_TIMEOUT": "4000",
    }
    cut_s = 10.0
    cut_at, lines = _call_through_a_silent_link(pg_url, tmp_path, "read", cut_s, env)
    outcome = lines[-1]
    assert outcome.get("value") == 7, lines
    logged = [line for line in lines if "log" in line]
    assert len(logged) == 2, lines
    assert "unreachable" in logged[0]["log"] and "reachable again" in logged[1]["log"]
    detected = logged[0]["at"] - cut_at
    done = outcome["ended"] - cut_at
    print(f"short settings: detected after {detected:.1f} s, answered after {done:.1f} s")
    assert 2 <= detected <= 7, (detected, lines)  # 4 s of silence, not the cut's 10 s
    assert cut_s <= done <= cut_s + 15, (done, lines)
