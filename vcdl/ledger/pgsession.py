"""A PostgreSQL ledger connection's guards against a silent link and a frozen client.

Two failures leave a connection open but useless, and nothing else ends them:

* **the link goes silent**: a partition, a NAT or firewall that forgot the
  connection, a host gone without a reset. Every packet is dropped and none
  answers, so a call waits for a reply that never comes, for as long as the
  kernel keeps retransmitting (15 minutes by Linux's default) or, while only
  waiting to read, for ever. libpq's TCP keepalives and ``tcp_user_timeout``
  make the client's kernel give up within about 20 s; the call then fails as
  a lost connection and :mod:`vcdl.ledger.retry` reconnects where running it
  again cannot apply a write twice.
* **a client stops inside a transaction**: a driver frozen (SIGSTOP, a VM
  paused for live migration, a swap storm) or cut off between a write
  transaction's statements keeps its row locks, and a driver taking the run
  over (:mod:`vcdl.ledger.fence`) waits on them without end. The server's
  ``idle_in_transaction_session_timeout`` ends such a session and rolls its
  transaction back; ``statement_timeout`` bounds any one statement on the
  server, a lock wait included.

The first group is libpq's own connection parameters, the second the server's
settings, sent for each session in libpq's ``options`` (``-c name=value``).
Each comes from the URL's query, else the environment, else the default
(:data:`LINK_OPTIONS`, :data:`SESSION_OPTIONS`; the table is in
:mod:`vcdl.ledger.engine`). A URL's own ``options`` (or, without one,
``$PGOPTIONS``, which libpq would otherwise have read) is kept, with vcdl's
settings added after it; a setting it names itself is left to it.

Why these defaults:

* keepalives every 5 s after 10 s of silence, and ``tcp_user_timeout``
  20000 ms: a connection whose link answers nothing is ended 20 s after the
  last packet that came back (the kernel ends it at the first keepalive
  probe after ``tcp_user_timeout``, or when data it sent stays
  unacknowledged that long), within the 20-30 s an operator can wait for a
  call. Neither cuts a slow call on a live link: the server's kernel
  acknowledges data and answers probes while the statement runs.
  ``keepalives_count`` (3) applies only with ``tcp_user_timeout=0``: 25 s.
* ``idle_in_transaction_session_timeout`` 60 s: between a ledger
  transaction's statements the client runs a few lines of Python
  (milliseconds, or a round trip on a slow link), so only a frozen or cut-off
  client is idle for a minute; a takeover then waits at most that long.
  A client that wakes after it finds its session gone: a statement is run
  again in a new transaction (and refused if the run changed hands), never
  applied twice (:func:`vcdl.ledger.retry.rolled_back`).
* ``statement_timeout`` 300 s: a ledger statement takes a millisecond or
  less on the server, a read of a whole run's rows well under a second; the
  longest legitimate one waits for a row lock behind another transaction,
  which the idle limit above ends within a minute. Five times that cuts no
  legitimate call and still frees the server from a runaway one. A cut
  statement raises (SQLSTATE 57014), it is not retried. Schema migrations run
  without it (:meth:`~vcdl.ledger.engine.LedgerEngine.ensure_schema`): an
  upgrade of a large ledger may rebuild indexes for longer, and the processes
  queued on its advisory lock wait for it.

Behind PgBouncer (1.20 or later refuses ``-c`` settings it does not track
unless ``options`` is in its ``ignore_startup_parameters``), set both server
settings to ``default``, which sends neither, and give them to the role instead:
``ALTER ROLE vcdl SET statement_timeout = '300s'``.
"""

from __future__ import annotations

import os
import re
from typing import Any, Final

from sqlalchemy.engine import URL

from vcdl.errors import LedgerError

__all__ = ["LINK_OPTIONS", "SESSION_OPTIONS", "session_connect_args"]

# libpq connection parameters vcdl sets unless told otherwise: default, environment
# variable. Integers >= 0; tcp_user_timeout in milliseconds, the others in seconds
# (keepalives: 1 on, 0 off).
LINK_OPTIONS: Final[dict[str, tuple[int, str]]] = {
    "keepalives": (1, "VCDL_LEDGER_KEEPALIVES"),
    "keepalives_idle": (10, "VCDL_LEDGER_KEEPALIVES_IDLE"),
    "keepalives_interval": (5, "VCDL_LEDGER_KEEPALIVES_INTERVAL"),
    "keepalives_count": (3, "VCDL_LEDGER_KEEPALIVES_COUNT"),
    "tcp_user_timeout": (20000, "VCDL_LEDGER_TCP_USER_TIMEOUT"),
}
# Server settings sent for each session in libpq's options: default, environment
# variable. PostgreSQL's syntax with a unit, 0 (off), or ``default`` (or empty: not sent).
SESSION_OPTIONS: Final[dict[str, tuple[str, str]]] = {
    "statement_timeout": ("300s", "VCDL_LEDGER_STATEMENT_TIMEOUT"),
    "idle_in_transaction_session_timeout": (
        "60s",
        "VCDL_LEDGER_IDLE_IN_TRANSACTION_SESSION_TIMEOUT",
    ),
}
# A duration as vcdl accepts it: a unit is required (a bare number is milliseconds
# to PostgreSQL, seconds everywhere else in vcdl's settings), except for 0.
_DURATION: Final = re.compile(r"0|[0-9]+(ms|s|min|h|d)")
# The settings an options string names: -c name=value, -cname=value, --name=value.
_NAMED: Final = re.compile(r"(?:^|\s)(?:-c\s*|--)([A-Za-z0-9_.-]+)=")


def _raw(url: URL, name: str, env: str) -> tuple[str | None, str]:
    """A setting's text from the URL, else the environment, and where it came from."""
    if name in url.query:
        value = url.query[name]
        return (value[-1] if isinstance(value, tuple) else value), f"URL parameter {name}"
    return os.environ.get(env), f"${env}"


def named_settings(options: str) -> set[str]:
    """The server settings an ``options`` string sets, lower case (dashes as underscores)."""
    return {m.group(1).lower().replace("-", "_") for m in _NAMED.finditer(options)}


def session_connect_args(url: URL, display: str) -> tuple[URL, dict[str, Any]]:
    """``url`` without what vcdl moves out of it, and the ``connect_args`` to add.

    libpq parameters the URL sets stay in it (checked here, so a bad value is
    refused before connecting); the others come from the environment or the
    defaults. The server settings and the URL's ``options`` leave the URL and
    come back combined in ``connect_args["options"]``. Raises
    :class:`LedgerError` for a value that is not a setting's kind.
    """
    args: dict[str, Any] = {}
    for name, (default, env) in LINK_OPTIONS.items():
        raw, where = _raw(url, name, env)
        try:
            value = int(raw) if raw is not None else default
            if value < 0:
                raise ValueError
        except ValueError:
            raise LedgerError(
                f"ledger {display}: {where} must be an integer >= 0, got {raw!r}"
            ) from None
        if name not in url.query:
            args[name] = value

    user = url.query.get("options")
    if isinstance(user, tuple):
        user = " ".join(user)
    if user is None:
        user = os.environ.get("PGOPTIONS")
    user = (user or "").strip()
    theirs = named_settings(user)
    parts = [user] if user else []
    for name, (fallback, env) in SESSION_OPTIONS.items():
        raw, where = _raw(url, name, env)
        setting = (fallback if raw is None else raw).strip()
        if setting.lower() == "default":
            setting = ""  # not sent: the server's (or the role's) own setting applies
        if setting and not _DURATION.fullmatch(setting):
            raise LedgerError(
                f"ledger {display}: {where} must be a duration with a unit "
                f"(500ms, 60s, 5min, 1h), 0 (off) or default (the server's setting), got {raw!r}"
            )
        if setting and name not in theirs:
            parts.append(f"-c {name}={setting}")
    if parts:
        args["options"] = " ".join(parts)
    return url.difference_update_query(["options", *SESSION_OPTIONS]), args
