"""Item 5 of issue 50: the store or the ledger unreachable for a while, then back.

A real S3 endpoint (moto on loopback), and a real PostgreSQL, reached through the fleet harness's
userspace proxy (benchmarks/netfleet/proxy.py), which needs no namespace: a
``reset`` cut resets every connection and every new one, as a partition
where the far side answers with RST does (a client sees ECONNRESET, botocore
``ConnectionClosedError``). The store's calls must stall through the cut and
go on after it (vcdl/store/s3retry.py), log one line at its start and one at
its end, and a group whose writer gave up must never be readable as whole.
The ledger's reads and writes must do the same (vcdl/ledger/retry.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import torch
from sqlalchemy.engine import make_url

from benchmarks.netfleet.proxy import DRIVER, LinkProxy
from tests.s3fixture import make_bucket, s3_storage_options
from vcdl.errors import StoreError
from vcdl.ledger import Ledger
from vcdl.store import WeightStore
from vcdl.transient import RetryPolicy

pytestmark = pytest.mark.slow

CUT = 3.0  # seconds


@pytest.fixture
def proxied(s3_endpoint: str) -> Iterator[tuple[LinkProxy, str, dict[str, object]]]:
    """A proxy in front of moto, the store URL and the storage options that go through it."""
    target = urlsplit(s3_endpoint)
    proxy = LinkProxy(lambda _peer: DRIVER)
    try:
        host, port = proxy.add_route("s3", "127.0.0.1", (target.hostname or "", target.port or 0))
        endpoint = f"http://{host}:{port}"
        url = f"s3://{make_bucket(s3_endpoint)}/store"
        yield proxy, url, s3_storage_options(endpoint)
    finally:
        proxy.close()


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(256, 64, generator=g), "b": torch.randn(64, generator=g)}


def test_a_store_cut_stalls_writes_and_reads_then_they_go_on(
    proxied: tuple[LinkProxy, str, dict[str, object]], caplog: pytest.LogCaptureFixture
) -> None:
    proxy, url, options = proxied
    store = WeightStore(url, dict(options))
    store.write_state("runs/r/v0", _state(0))  # the store has answered this process

    proxy.cut(DRIVER, CUT, "reset")
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, "vcdl.transient"):
        store.write_state("runs/r/v1", _state(1))
        back = store.read_state("runs/r/v1")
    stalled = time.monotonic() - began

    assert all(torch.equal(back[k], v) for k, v in _state(1).items())
    assert CUT * 0.8 <= stalled < CUT + 20, stalled
    lines = [r.getMessage() for r in caplog.records if r.name == "vcdl.transient"]
    assert len(lines) == 2, lines
    assert "unreachable" in lines[0] and url in lines[0]
    assert "reachable again" in lines[1]


def test_a_write_that_outlasts_the_policy_leaves_no_readable_group(
    proxied: tuple[LinkProxy, str, dict[str, object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A result written over a link that fails for good is rejected, never half-read."""
    from vcdl.store import s3retry

    proxy, url, options = proxied
    short = RetryPolicy(first=0.1, cap=0.3, deadline=1.0)
    install = s3retry.install
    monkeypatch.setattr(s3retry, "install", lambda fs, name: install(fs, name, short))
    store = WeightStore(url, dict(options))
    store.write_state("runs/r/v0", _state(0))

    # Cut the link once the first chunk is on its way: the write is cut in two.
    cutter = threading.Timer(0.05, proxy.cut, (DRIVER, 30.0, "reset"))
    cutter.start()
    try:
        with pytest.raises(StoreError):
            store.write_state("runs/r/result", _state(2) | {"big": torch.randn(2048, 1024)})
    finally:
        cutter.join()
        proxy.uncut(DRIVER)
    assert not store.exists("runs/r/result")
    with pytest.raises(StoreError):
        store.read_state("runs/r/result")


def test_a_ledger_cut_stalls_reads_and_writes_then_they_go_on(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    parsed = make_url(pg_url)
    proxy = LinkProxy(lambda _peer: DRIVER)
    try:
        host, port = proxy.add_route("pg", "127.0.0.1", (parsed.host or "", parsed.port or 5432))
        ledger = Ledger(parsed.set(host=host, port=port).render_as_string(hide_password=False))
        ledger.create_run("p", "{}", "p/v0", "c0")  # the ledger has answered this process

        proxy.cut(DRIVER, CUT, "reset")
        began = time.monotonic()
        with caplog.at_level(logging.WARNING, "vcdl.transient"):
            subtasks = ledger.ensure_subtasks("p", 0, 2)  # a write transaction
            head = ledger.head("p")  # PostgreSQL's fast path, a read
        stalled = time.monotonic() - began
        ledger.close()
    finally:
        proxy.close()

    assert len(subtasks) == 2 and head.number == 0
    assert CUT * 0.8 <= stalled < CUT + 20, stalled
    lines = [r.getMessage() for r in caplog.records if r.name == "vcdl.transient"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("ledger postgresql") and "unreachable" in lines[0]
    assert "reachable again" in lines[1]


def _echo_seconds(address: tuple[str, int]) -> float:
    """One round trip of a byte through ``address`` on a new connection, in seconds."""
    import socket

    began = time.monotonic()
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(b"x")
        assert sock.recv(1) == b"x"
    return time.monotonic() - began


def test_a_route_cut_stops_that_service_alone() -> None:
    """The chaos target's "driver cut from the store": its other routes stay up."""
    from benchmarks.netfleet.proxy import route_link
    from tests.netfleetfixture import TcpServers

    servers = TcpServers()
    proxy = LinkProxy(lambda _peer: DRIVER)
    try:
        echo = ("127.0.0.1", servers.port(servers.echo))
        store = proxy.add_route("store", "127.0.0.1", echo)
        ledger = proxy.add_route("ledger", "127.0.0.1", echo)
        with pytest.raises(KeyError, match="LINK>ROUTE with a route of ledger, store"):
            proxy.cut(route_link(DRIVER, "nope"), CUT, "stall")
        proxy.cut(route_link(DRIVER, "store"), CUT, "stall")
        cut_at = time.monotonic()
        assert _echo_seconds(ledger) < 1.0  # the driver's other service: untouched
        held = _echo_seconds(store)
        assert held >= CUT - (time.monotonic() - cut_at) - 0.2, held  # held to the cut's end
        assert _echo_seconds(store) < 1.0  # and back after it
        proxy.cut(route_link(DRIVER, "store"), CUT, "reset")
        with pytest.raises(OSError):
            _echo_seconds(store)
        assert _echo_seconds(ledger) < 1.0
    finally:
        proxy.close()
        servers.close()
