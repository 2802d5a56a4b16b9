"""A PostgreSQL write transaction whose connection was lost while its COMMIT was on the way.

Such a commit may or may not have been applied: the server may have received
the COMMIT and committed before the link went, or not. Running the
transaction again could apply it twice (a merge folded in twice); raising
ends the caller (a driver's run stops on a link that blinked at the wrong
moment). Neither is right, and neither is needed: PostgreSQL keeps each
transaction's fate, and ``txid_status(xid)`` says, from any session, whether
transaction ``xid`` committed, aborted or is still in progress — the use its
documentation names (PostgreSQL 10 and later).

This module owns that protocol:

* every write transaction on PostgreSQL learns its own transaction id before
  its COMMIT is sent (:func:`transaction_id`: ``txid_current()``, which also
  assigns one; a fenced driver's lease check reads it in the same statement,
  :mod:`vcdl.ledger.fence`, so the driver pays no extra round trip);
* after a COMMIT lost on the way, :func:`commit_outcome` asks the server,
  reconnecting with the ledger's backoff while it cannot be reached, and
  waiting while the old session still holds the transaction open (its
  server process ends it when it finds the client gone, or at the latest the
  session's ``idle_in_transaction_session_timeout``, :mod:`vcdl.ledger.pgsession`);
* :func:`decide` turns the answer into what the caller does: ``committed``,
  return what the transaction computed; ``aborted``, run it again (nothing
  of it was applied); ``unknown`` (the server no longer remembers, or kept no
  answer for the whole wait), raise as before.

A one-statement write in autocommit mode (PostgreSQL's fast path,
:mod:`vcdl.ledger.pg`) has no id before it is sent; its lost commit is still
raised (a worker's attempt then fails and is retried as a new attempt).
"""

from __future__ import annotations

import logging
import time
from typing import Final, Literal

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from vcdl.ledger.retry import lost_connection, wait_to_reconnect
from vcdl.transient import Outage

log = logging.getLogger(__name__)

XID_KEY: Final = "vcdl.xid"
"""Where a transaction's id, once read, waits in its connection's ``info`` for the commit."""

XID_SQL: Final = "txid_current()"
"""The SQL expression of the running transaction's id (assigned if it had none)."""

IN_PROGRESS_WAIT: Final = 120.0
"""How long to wait for a transaction the server still shows in progress (s): past
the session's idle-in-transaction limit (60 s) and a dead link's detection (~20 s)."""

Outcome = Literal["committed", "aborted", "wait", "unknown"]


def decide(status: str | None) -> Outcome:
    """What to do on ``txid_status``'s answer (None: the server no longer knows the id)."""
    if status == "committed":
        return "committed"
    if status == "aborted":
        return "aborted"
    if status == "in progress":
        return "wait"
    return "unknown"


def forget_id(conn: Connection) -> None:
    """Drop an id a previous transaction on this pooled connection left behind."""
    conn.info.pop(XID_KEY, None)


def note_id(conn: Connection, xid: int) -> None:
    """Record ``xid`` (read in a statement of the caller's) as ``conn``'s transaction's id."""
    conn.info[XID_KEY] = int(xid)


def transaction_id(conn: Connection) -> int:
    """The id of ``conn``'s running transaction: as noted, else read (one round trip)."""
    xid = conn.info.pop(XID_KEY, None)
    if xid is None:
        xid = conn.execute(text(f"SELECT {XID_SQL}")).scalar_one()
    return int(xid)


def commit_outcome(
    engine: Engine, xid: int, service: Outage, *, began: float, n: int = 0
) -> Outcome:
    """Whether transaction ``xid``, whose COMMIT was lost on the way, committed.

    ``committed``, ``aborted`` or ``unknown``: asked on ``engine`` (autocommit
    reads), reconnecting under the ledger's policy (``service``; ``began`` and
    ``n`` as :func:`~vcdl.ledger.retry.wait_to_reconnect` takes them) and
    waiting up to :data:`IN_PROGRESS_WAIT` while the server shows it in progress.
    """
    query = text("SELECT txid_status(:xid)")
    waiting_since: float | None = None
    while True:
        try:
            with engine.connect() as conn:
                status = conn.execute(query, {"xid": xid}).scalar()
        except DBAPIError as exc:
            if lost_connection(exc) and wait_to_reconnect(
                exc, "connect", service, reads=True, autocommit=True, n=n, began=began
            ):
                n += 1
                continue
            log.warning("could not learn the outcome of transaction %d: %s", xid, exc)
            return "unknown"
        outcome = decide(status)
        if outcome != "wait":
            log.info("transaction %d, whose commit was lost on the way: %s", xid, outcome)
            return outcome
        now = time.monotonic()
        waiting_since = now if waiting_since is None else waiting_since
        if now - waiting_since > IN_PROGRESS_WAIT:
            return "unknown"
        time.sleep(0.5)
