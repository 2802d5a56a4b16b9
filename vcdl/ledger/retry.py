"""How both ledger engines retry a transient database error: which errors, how often, how long.

Shared by :mod:`vcdl.ledger.engine` (every backend's transactions) and
:mod:`vcdl.ledger.pg` (PostgreSQL's fast path), which import nothing of each
other's, so that the two keep one policy. Two kinds of transient error:

* a serialization failure or deadlock: the transaction was rolled back whole
  and is re-run at once, a few times (:data:`TRANSIENT_RETRIES`);
* a server that could not be reached or went away (:func:`lost_connection`):
  retried under :data:`vcdl.transient.DEFAULT_POLICY` (backoff for at least a
  minute, the outage logged once), but only where repeating cannot apply a
  write twice (:func:`safe_to_repeat`). A write whose connection was lost
  while its commit was on the way may or may not have been applied; it is
  never guessed at: a PostgreSQL transaction's fate is asked of the server
  (:mod:`vcdl.ledger.outcome`), anything else raised. A session the server ended for sitting
  idle in a transaction (SQLSTATE 25P03, :mod:`vcdl.ledger.pgsession`) is the
  exception: its transaction was rolled back, so any call is run again.

A refusal by the ledger itself (a fencing token, a state move, a unique
constraint) is never transient.
"""

from __future__ import annotations

import random
import time
from typing import Final, Literal

from vcdl.transient import DEFAULT_POLICY, Outage, RetryPolicy, outage

# PostgreSQL SQLSTATEs after which re-running the whole transaction is correct:
# serialization_failure and deadlock_detected.
TRANSIENT_SQLSTATES: Final = frozenset({"40001", "40P01"})
TRANSIENT_RETRIES: Final = 8

# The server was away, not the statement wrong: admin_shutdown, crash_shutdown,
# cannot_connect_now, too_many_connections, idle_in_transaction_session_timeout;
# and every connection_exception (08...).
_AWAY_SQLSTATES: Final = frozenset({"57P01", "57P02", "57P03", "53300", "25P03"})
# The server ended the session because it sat idle inside a transaction
# (vcdl.ledger.pgsession): that transaction was rolled back, its commit never ran.
_IDLE_ENDED: Final = "25P03"

Phase = Literal["connect", "run", "commit"]
"""Where a call was when it failed: getting a connection (nothing sent), running its
statements, committing."""

# Jitter from its own generator: the global one is the user's (their seeds,
# their reproducibility), and a driver process shares it with them.
_JITTER = random.Random()


def jitter(low: float, high: float) -> float:
    """A uniform draw in [low, high] that leaves the process's global ``random`` alone."""
    return _JITTER.uniform(low, high)


def transient_pause(attempt: int) -> None:
    """Sleep before retry ``attempt + 1``: jittered, longer with every attempt."""
    time.sleep(jitter(0.005, 0.05) * (attempt + 1))


def lost_connection(error: BaseException) -> bool:
    """Whether a database error (SQLAlchemy's or psycopg's) says the server could not be
    reached or went away: refused, reset or timed out, shut down, out of connections."""
    orig = getattr(error, "orig", error)
    if getattr(error, "connection_invalidated", False):
        return True
    sqlstate = getattr(orig, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate:
        return sqlstate.startswith("08") or sqlstate in _AWAY_SQLSTATES
    # psycopg reports a failed or broken connection as OperationalError with no
    # SQLSTATE (sqlite3's OperationalError, "database is locked", is not one).
    kind = type(orig)
    return kind.__name__ == "OperationalError" and kind.__module__.startswith("psycopg")


def rolled_back(error: BaseException) -> bool:
    """Whether ``error`` says the server ended the session while it sat idle inside
    a transaction: the transaction was rolled back whole, so running the call again
    applies nothing twice, whatever was on the way (a COMMIT included)."""
    return getattr(getattr(error, "orig", error), "sqlstate", None) == _IDLE_ENDED


def safe_to_repeat(phase: Phase, *, reads: bool, autocommit: bool) -> bool:
    """Whether a call that lost its connection in ``phase`` may simply be run again.

    Before anything was sent, always; a read, always; a write inside a transaction
    while its statements ran (the server rolls back a transaction whose connection
    dies); never a commit on the way, nor an autocommit write that was sent (each
    statement commits by itself).
    """
    if phase == "connect" or reads:
        return True
    return phase == "run" and not autocommit


def ledger_outage(display: str) -> Outage:
    """The process's outage log of the ledger shown as ``display`` (redacted)."""
    return outage(f"ledger {display}")


def reconnect_pause(
    error: BaseException,
    phase: Phase,
    service: Outage,
    *,
    reads: bool,
    autocommit: bool,
    n: int,
    elapsed: float,
    policy: RetryPolicy = DEFAULT_POLICY,
) -> float | None:
    """The pause before running a call again after ``error`` in ``phase`` (``n`` such
    pauses taken, ``elapsed`` seconds since the call began), or None: raise it. Only a
    lost connection, safe to repeat, within the policy's deadline (a ledger that never
    answered this process: a few quick retries, :meth:`~vcdl.transient.Outage.may_retry`)."""
    if not (service.may_retry(n) and lost_connection(error)):
        return None
    if not (rolled_back(error) or safe_to_repeat(phase, reads=reads, autocommit=autocommit)):
        return None
    return policy.next_pause(n, elapsed, _JITTER)


def wait_to_reconnect(
    error: BaseException,
    phase: Phase,
    service: Outage,
    *,
    reads: bool,
    autocommit: bool,
    n: int,
    began: float,
    policy: RetryPolicy = DEFAULT_POLICY,
) -> bool:
    """After ``error``: True once the outage is recorded and the pause slept (run the
    call again, the ``n + 1``-th time); False when it is not to be retried (raise it).
    ``began``: the call's start, on :func:`time.monotonic`. The one tail of both
    ledger retry loops (SQLAlchemy's transactions and PostgreSQL's fast path)."""
    pause = reconnect_pause(
        error,
        phase,
        service,
        reads=reads,
        autocommit=autocommit,
        n=n,
        elapsed=time.monotonic() - began,
        policy=policy,
    )
    if pause is None:
        return False
    service.failed(error, policy, began=began, tries=n + 1)
    time.sleep(pause)
    return True
