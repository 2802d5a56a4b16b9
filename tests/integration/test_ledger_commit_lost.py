"""A PostgreSQL write whose connection is lost while its COMMIT is on the way.

The CI failure this answers: a run's PostgreSQL ledger reached through a link
cut for 20 s (tests/integration/test_partition_run.py); the cut met a driver's
write with its COMMIT on the way, and the run stopped on "server closed the
connection unexpectedly", as a commit of unknown outcome was raised. Now the
engine asks the server what became of the transaction (vcdl/ledger/outcome.py):

* the COMMIT never ran (the server ended the session first): the transaction
  is run again, and applied once;
* the COMMIT ran but its answer was lost (the client's socket shut while a
  deferred trigger held the commit on the server): the call returns what the
  transaction computed, without running it again; while the server still
  shows the transaction in progress, the engine waits.

Real server, no mocks: the session is ended with ``pg_terminate_backend``, the
answer lost by shutting the client's own socket.
"""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
from sqlalchemy import Connection, event, text

from vcdl.ledger.engine import LedgerEngine
from vcdl.ledger.fence import FencedEngine
from vcdl.ledger.outcome import decide

pytestmark = pytest.mark.postgres

SLOW_COMMIT_S = 1.5


def _engine_with_table(pg_url: str) -> LedgerEngine:
    engine = LedgerEngine(pg_url)
    engine.ensure_schema()

    def ddl(c: Connection) -> None:
        c.exec_driver_sql("CREATE TABLE scratch (k text PRIMARY KEY, n int NOT NULL)")
        # A deferred constraint trigger runs at COMMIT: it holds the commit on the
        # server for SLOW_COMMIT_S, so the client can lose the answer meanwhile.
        c.exec_driver_sql(
            "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN PERFORM pg_sleep({SLOW_COMMIT_S}); RETURN NULL; END $$"
        )
        c.exec_driver_sql(
            "CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON scratch DEFERRABLE "
            "INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.k = 'slow') EXECUTE FUNCTION slow_commit()"
        )

    engine.write(ddl)
    return engine


def test_the_outcome_of_each_answer() -> None:
    assert decide("committed") == "committed"
    assert decide("aborted") == "aborted"
    assert decide("in progress") == "wait"
    assert decide(None) == "unknown"


def test_a_commit_that_never_ran_is_run_again_once(pg_url: str) -> None:
    engine = _engine_with_table(pg_url)
    runs: list[int] = []
    admin = engine.engine.execution_options(isolation_level="AUTOCOMMIT")

    def end_the_session(conn: Connection) -> None:
        # Before the first COMMIT is sent: its session ends, its transaction aborts.
        if len(runs) == 1:
            pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            with admin.connect() as other:
                other.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})

    def tx(c: Connection) -> str:
        runs.append(1)
        c.exec_driver_sql(
            "INSERT INTO scratch VALUES ('a', 1) ON CONFLICT (k) DO UPDATE SET n = scratch.n + 1"
        )
        end_the_session(c)
        return "done"

    try:
        assert engine.write(tx) == "done"
        assert len(runs) == 2  # aborted, so run again
        n = engine.read(lambda c: c.exec_driver_sql("SELECT n FROM scratch WHERE k='a'").scalar())
        assert n == 1  # applied once
    finally:
        engine.dispose()


def _shut_during_commit(engine: LedgerEngine) -> list[threading.Thread]:
    """Shut the client's socket ~0.5 s after its next COMMIT is sent (the trigger holds it)."""
    fired: list[threading.Thread] = []

    @event.listens_for(engine.engine, "commit")
    def on_commit(conn: Connection) -> None:
        if fired:
            return
        fd = conn.connection.driver_connection.pgconn.socket  # type: ignore[union-attr]

        def shut() -> None:
            time.sleep(0.5)
            with socket.socket(fileno=os.dup(fd)) as s:
                s.shutdown(socket.SHUT_RDWR)

        fired.append(threading.Thread(target=shut, daemon=True))
        fired[0].start()

    return fired


@pytest.mark.parametrize("fenced", [False, True], ids=["plain", "fenced"])
def test_a_commit_whose_answer_was_lost_returns_without_running_again(
    pg_url: str, fenced: bool
) -> None:
    inner = _engine_with_table(pg_url)
    engine: LedgerEngine = inner
    if fenced:
        from vcdl.ledger import Ledger

        with Ledger(pg_url) as led:
            led.create_run("r", "{}", "r/v0", "c0")
        generation = inner.read(
            lambda c: c.exec_driver_sql("SELECT lease_generation FROM run").scalar()
        )
        engine = FencedEngine(inner, "r", int(generation))
    statements: list[str] = []

    @event.listens_for(inner.engine, "before_cursor_execute")
    def seen(_c: object, _cur: object, statement: str, *_a: object) -> None:
        statements.append(statement)

    shutters = _shut_during_commit(inner)
    runs: list[int] = []

    def tx(c: Connection) -> str:
        runs.append(1)
        c.exec_driver_sql("INSERT INTO scratch VALUES ('slow', 1)")  # a rerun would conflict
        return "merged"

    began = time.monotonic()
    try:
        assert engine.write(tx) == "merged"
        assert shutters, "no COMMIT was seen"
        shutters[0].join(5)
        assert time.monotonic() - began >= SLOW_COMMIT_S  # it waited for the server's answer
        assert len(runs) == 1
        assert inner.read(lambda c: c.exec_driver_sql("SELECT count(*) FROM scratch").scalar()) == 1
        asked = [s for s in statements if "txid_status" in s]
        assert asked, statements
        own = [s for s in statements if "txid_current" in s]
        # Fenced: the id comes with the lease check, no statement of its own.
        assert len(own) == 1 and (("lease_generation" in own[0]) == fenced), own
    finally:
        inner.dispose()
