"""A PostgreSQL ledger's guards against a silent link and a frozen client, on a real server.

vcdl/ledger/pgsession.py: libpq's TCP keepalives and ``tcp_user_timeout`` on
every ledger connection (SQLAlchemy's and the fast path's, one pool), the
server's ``statement_timeout`` and ``idle_in_transaction_session_timeout``
sent in libpq's ``options`` next to the URL's own; each from the URL, else
the environment, else the default. The silent link itself is cut in
tests/integration/test_ledger_blackhole.py.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import pytest
from sqlalchemy import Connection
from sqlalchemy.engine import make_url

from vcdl.errors import LedgerError
from vcdl.ledger import Ledger
from vcdl.ledger.engine import LedgerEngine
from vcdl.ledger.pgsession import named_settings, session_connect_args

SETTINGS = (
    "SELECT current_setting('statement_timeout'), "
    "current_setting('idle_in_transaction_session_timeout'), current_setting('search_path')"
)


def with_query(url: str, **query: str) -> str:
    return make_url(url).update_query_dict(query).render_as_string(hide_password=False)


def server_settings(ledger: Ledger) -> tuple[Any, ...]:
    """(statement_timeout, idle_in_transaction_session_timeout, search_path) twice: on an
    SQLAlchemy transaction's connection and on the fast path's, which must agree."""
    engine = ledger._db
    row = engine.read(lambda c: tuple(c.exec_driver_sql(SETTINGS).one()))
    assert ledger._pg is not None
    fast = ledger._pg.fetch_one(SETTINGS, {}, repeatable=True)
    assert fast == row
    return row


def socket_options(ledger: Ledger) -> dict[str, int]:
    """The TCP options the kernel holds for a pooled ledger connection's socket."""
    fairy = ledger._engine.raw_connection()
    try:
        fd = os.dup(fairy.driver_connection.fileno())  # type: ignore[union-attr]
        sock = socket.socket(fileno=fd)
        try:
            return {
                "keepalive": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                "idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                "interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                "count": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
                "user_timeout": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
            }
        finally:
            sock.detach()
            os.close(fd)
    finally:
        fairy.close()


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("VCDL_LEDGER_KEEPALIVES", "VCDL_LEDGER_TCP_", "PGOPTIONS")):
            monkeypatch.delenv(name)
    monkeypatch.delenv("VCDL_LEDGER_STATEMENT_TIMEOUT", raising=False)
    monkeypatch.delenv("VCDL_LEDGER_IDLE_IN_TRANSACTION_SESSION_TIMEOUT", raising=False)


def test_the_defaults_reach_the_server_and_the_socket_and_the_urls_options_stay(
    pg_url: str,
) -> None:
    schema = str(make_url(pg_url).query["options"]).split("=", 1)[1]
    ledger = Ledger(pg_url)  # the URL's own options: -csearch_path=<its schema>
    try:
        ledger.create_run("s", "{}", "s/v0", "c0")  # in the URL's schema
        assert server_settings(ledger) == ("5min", "1min", schema)
        assert socket_options(ledger) == {
            "keepalive": 1,
            "idle": 10,
            "interval": 5,
            "count": 3,
            "user_timeout": 20000,
        }
    finally:
        ledger.close()


def test_url_beats_environment_beats_default(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VCDL_LEDGER_STATEMENT_TIMEOUT", "45s")
    monkeypatch.setenv("VCDL_LEDGER_IDLE_IN_TRANSACTION_SESSION_TIMEOUT", "30s")
    monkeypatch.setenv("VCDL_LEDGER_KEEPALIVES_IDLE", "7")
    monkeypatch.setenv("VCDL_LEDGER_TCP_USER_TIMEOUT", "9000")
    url = with_query(pg_url, idle_in_transaction_session_timeout="2min", keepalives_interval="2")
    ledger = Ledger(url)
    try:
        assert server_settings(ledger)[:2] == ("45s", "2min")
        opts = socket_options(ledger)
        assert (opts["idle"], opts["interval"], opts["user_timeout"]) == (7, 2, 9000)
    finally:
        ledger.close()


def test_a_setting_the_urls_options_make_is_theirs_and_empty_sends_none(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed = make_url(pg_url)
    own = f"{parsed.query['options']} -c statement_timeout=7s -c lock_timeout=3s"
    monkeypatch.setenv("VCDL_LEDGER_STATEMENT_TIMEOUT", "45s")  # the URL's options win
    url = with_query(pg_url, options=own, idle_in_transaction_session_timeout="default")
    ledger = Ledger(url)
    try:
        # default: not sent, the server's own setting (off here) applies.
        assert server_settings(ledger)[:2] == ("7s", "0")
        assert ledger._db.read(lambda c: c.exec_driver_sql("SHOW lock_timeout").scalar()) == "3s"
    finally:
        ledger.close()


def test_pgoptions_is_kept_when_the_url_has_no_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=4s")
    _, args = session_connect_args(make_url("postgresql+psycopg://u@h/db"), "pg")
    assert args["options"] == (
        "-c lock_timeout=4s -c statement_timeout=300s -c idle_in_transaction_session_timeout=60s"
    )
    monkeypatch.delenv("PGOPTIONS")
    monkeypatch.setenv("VCDL_LEDGER_STATEMENT_TIMEOUT", "")  # empty: not sent
    _, args = session_connect_args(make_url("postgresql+psycopg://u@h/db"), "pg")
    assert args["options"] == "-c idle_in_transaction_session_timeout=60s"
    assert named_settings("-cA=1 -c b=2 --c-d=3 -c  e=4") == {"a", "b", "c_d", "e"}


@pytest.mark.parametrize(
    ("query", "env", "says"),
    [
        ({"statement_timeout": "300"}, {}, "URL parameter statement_timeout must be a duration"),
        ({}, {"VCDL_LEDGER_IDLE_IN_TRANSACTION_SESSION_TIMEOUT": "1 min"}, "$VCDL_LEDGER_IDLE"),
        ({"statement_timeout": "1s -c role=admin"}, {}, "must be a duration"),
        ({"keepalives_idle": "-1"}, {}, "URL parameter keepalives_idle must be an integer"),
        ({}, {"VCDL_LEDGER_TCP_USER_TIMEOUT": "20s"}, "$VCDL_LEDGER_TCP_USER_TIMEOUT must"),
    ],
)
def test_a_bad_value_is_refused_before_connecting(
    query: dict[str, str], env: dict[str, str], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    url = make_url("postgresql+psycopg://u@192.0.2.1:5432/db").update_query_dict(query)
    with pytest.raises(LedgerError, match=r"must be") as err:
        LedgerEngine(url.render_as_string(hide_password=False))
    assert says in str(err.value)


def test_a_frozen_transaction_is_ended_and_a_takeover_does_not_wait_for_it(
    pg_url: str,
) -> None:
    url = with_query(pg_url, idle_in_transaction_session_timeout="1s")
    frozen, taker = Ledger(url), Ledger(url)
    try:
        frozen.create_run("t", "{}", "t/v0", "c0")
        generation = frozen.acquire_lease("t", "frozen-driver", 0.05)
        time.sleep(0.1)  # its lease expired; it does not know
        # The frozen driver's fenced write: the run's row read FOR SHARE, then nothing.
        conn = frozen._engine.connect()
        conn.begin()
        conn.exec_driver_sql("SELECT lease_generation FROM run WHERE name = 't' FOR SHARE")
        began = time.monotonic()
        assert taker.acquire_lease("t", "new-driver", 60) == generation + 1
        waited = time.monotonic() - began
        assert 0.5 < waited < 10, waited  # held by the frozen one until the server ended it
        with pytest.raises(Exception, match="idle-in-transaction timeout"):
            conn.exec_driver_sql("SELECT 1")
        conn.close()
    finally:
        frozen.close()
        taker.close()


def test_a_transaction_the_server_ended_is_run_again_even_at_its_commit(pg_url: str) -> None:
    url = with_query(pg_url, idle_in_transaction_session_timeout="500ms")
    engine = LedgerEngine(url)
    engine.ensure_schema()
    try:
        engine.write(lambda c: c.exec_driver_sql("CREATE TABLE probe (n int)"))
        for where in ("between statements", "before its commit"):
            calls: list[int] = []

            def tx(c: Connection, where: str = where, calls: list[int] = calls) -> None:
                calls.append(1)
                c.exec_driver_sql("INSERT INTO probe VALUES (1)")
                if len(calls) == 1:
                    time.sleep(1.5)  # frozen: the server ends the session
                if where == "between statements":
                    c.exec_driver_sql("INSERT INTO probe VALUES (1)")

            engine.write(tx)
            assert len(calls) == 2, where
        # The first, ended tries left nothing: one row per finished call.
        assert engine.read(lambda c: c.exec_driver_sql("SELECT count(*) FROM probe").scalar()) == 3
    finally:
        engine.dispose()


def test_a_statement_past_the_timeout_is_cut_and_not_retried(pg_url: str) -> None:
    engine = LedgerEngine(with_query(pg_url, statement_timeout="300ms"))
    try:
        began = time.monotonic()
        with pytest.raises(LedgerError, match="statement timeout"):
            engine.read(lambda c: c.exec_driver_sql("SELECT pg_sleep(3)").scalar())
        assert time.monotonic() - began < 2
    finally:
        engine.dispose()


def test_a_migration_waits_on_its_lock_past_the_statement_timeout(pg_url: str) -> None:
    """Schema upgrades run without a statement timeout: a process queued on the advisory
    lock while another migrates is not cut."""
    import psycopg

    parsed = make_url(pg_url)
    holder = psycopg.connect(
        host=parsed.host,
        port=parsed.port,
        dbname=parsed.database,
        user=parsed.username,
        options=str(parsed.query["options"]),
        autocommit=True,
    )
    try:
        holder.execute("SELECT pg_advisory_lock(%s, hashtext(current_schema()))", (0x7663646C,))
        release = threading.Timer(1.5, holder.execute, ("SELECT pg_advisory_unlock_all()",))
        release.start()
        began = time.monotonic()
        ledger = Ledger(with_query(pg_url, statement_timeout="200ms"))
        waited = time.monotonic() - began
        release.join()
        ledger.create_run("m", "{}", "m/v0", "c0")
        ledger.close()
        assert waited > 1.0, waited
    finally:
        holder.close()
