"""The ledger's database plumbing: URLs, pools, transactions, the schema on open.

This module owns everything :class:`vcdl.ledger.Ledger` needs from SQLAlchemy
except the queries themselves:

* URL parsing and redaction (a password is never shown: not in logs, reprs
  nor in the messages of errors vcdl raises);
* the engine and its connection pool, per backend. PostgreSQL pools are sized
  for many worker processes (see :data:`POOL_OPTIONS`); SQLite connections get
  WAL, a busy timeout, foreign keys and ``BEGIN IMMEDIATE`` for writes;
* the transaction runner: one transaction per call, re-run whole after a
  PostgreSQL serialization failure or deadlock, or after a lost connection
  where that cannot apply a write twice (:mod:`vcdl.ledger.retry`), a
  PostgreSQL commit lost on the way resolved (:mod:`vcdl.ledger.outcome`), database
  errors turned into :class:`~vcdl.errors.LedgerError` with a message that
  says what to do;
* the schema on open: Alembic migrations to head (:mod:`vcdl.ledger.migrations`),
  serialized between processes by a PostgreSQL advisory lock or SQLite's
  write lock;
* how SQLite runs the two calls of the merge path that need more than one
  statement, starting an attempt and committing a merge
  (:func:`start_attempt_row`, :func:`commit_merge_row`): plain statements in
  a ``BEGIN IMMEDIATE`` transaction, as SQLite's write lock serializes whole
  transactions anyway. On PostgreSQL each is one statement in autocommit
  mode, run on psycopg directly (:mod:`vcdl.ledger.pg`). :mod:`vcdl.ledger`
  gives both their meaning and messages.

Pool settings (PostgreSQL; also honoured for SQLite files) come from the URL's
query, else the environment, else the defaults below, e.g.
``postgresql+psycopg://vcdl:pw@db:5432/vcdl?pool_size=1&max_overflow=4``:

==============  ============================  =======  ================================
URL parameter   environment variable          default  meaning
==============  ============================  =======  ================================
pool_size       VCDL_LEDGER_POOL_SIZE         2        connections kept open
max_overflow    VCDL_LEDGER_MAX_OVERFLOW      8        extra ones, closed when idle
pool_recycle    VCDL_LEDGER_POOL_RECYCLE      1800     reconnect after (seconds)
pool_timeout    VCDL_LEDGER_POOL_TIMEOUT      30       wait for a free one (seconds)
pool_ping_idle  VCDL_LEDGER_POOL_PING_IDLE    1        pre-ping after this idle (s)
==============  ============================  =======  ================================

Every process holds at most ``pool_size + max_overflow`` connections and keeps
``pool_size`` of them open while idle, so a fleet needs
``processes x (pool_size + max_overflow)`` below the server's
``max_connections``; past a few hundred processes, put PgBouncer in between.

Durability: every write waits for its WAL flush (PostgreSQL's default
``synchronous_commit=on``; SQLite's ``synchronous=FULL``), so a merge reported
committed survives a crash of the database server or its machine. Where
throughput matters more, a PostgreSQL ledger may opt in to asynchronous
commits through its URL, ``...?options=-csynchronous_commit%3Doff``: commits
then return before the flush (what that gains on a given server:
benchmarks/ledger.py ``--pg-async-commit``), and a server crash loses the
last fraction of a second (up to 3 x ``wal_writer_delay``) of acknowledged
writes — never consistency, but a merge a flow already acted on may vanish.
It is not the default, and benchmark figures with it are reported apart.

A silent link and a frozen client (PostgreSQL; why these defaults:
:mod:`vcdl.ledger.pgsession`): libpq's keepalives and ``tcp_user_timeout`` fail
a call on a link that stopped answering within about 20 s (then retried as a
lost connection); the server ends a session idle inside a transaction and
bounds every statement. URL, else environment, else default:

===================================  ===============================================  =======
URL parameter                        environment variable                             default
===================================  ===============================================  =======
keepalives                           VCDL_LEDGER_KEEPALIVES                           1
keepalives_idle                      VCDL_LEDGER_KEEPALIVES_IDLE                      10 (s)
keepalives_interval                  VCDL_LEDGER_KEEPALIVES_INTERVAL                  5 (s)
keepalives_count                     VCDL_LEDGER_KEEPALIVES_COUNT                     3
tcp_user_timeout                     VCDL_LEDGER_TCP_USER_TIMEOUT                     20000 (ms)
statement_timeout                    VCDL_LEDGER_STATEMENT_TIMEOUT                    300s
idle_in_transaction_session_timeout  VCDL_LEDGER_IDLE_IN_TRANSACTION_SESSION_TIMEOUT  60s
===================================  ===============================================  =======

The last two go in libpq's ``options`` after the URL's own (or ``$PGOPTIONS``),
unless those set them; a unit (``60s``), ``0`` (off) or ``default`` (not sent).

Connections are pinged before use (pre-ping) when they sat idle in the pool
for ``pool_ping_idle`` seconds or more, so a restarted server or a dropped
idle connection costs a reconnect, not an error. ``0`` pings on every
checkout (SQLAlchemy's ``pool_pre_ping``), which costs a round trip per ledger
call: a third of the client's CPU with 16 busy writers on 2 cores. A connection
back in the pool for less than a second has just worked; after a server
restart, the pool is invalidated by the first error anyway. Unless the URL
says otherwise, ``connect_timeout`` is 10 s and ``application_name`` is
``vcdl`` (visible in ``pg_stat_activity``).

Just over 500 lines (the transaction runner resolves a PostgreSQL commit lost
on the way, :mod:`vcdl.ledger.outcome`); the next split is the schema on open.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

from sqlalchemy import (
    Connection,
    Engine,
    create_engine,
    event,
    inspect,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, DisconnectionError

from vcdl.errors import LedgerError, LedgerNotFound, UnsupportedLedger
from vcdl.ledger import migrations
from vcdl.ledger.foreign import not_a_database, refuse_foreign, sqlite_tables
from vcdl.ledger.outcome import commit_outcome, forget_id, transaction_id
from vcdl.ledger.pgsession import session_connect_args
from vcdl.ledger.retry import (
    TRANSIENT_RETRIES,
    TRANSIENT_SQLSTATES,
    Phase,
    jitter,
    ledger_outage,
    lost_connection,
    transient_pause,
    wait_to_reconnect,
)
from vcdl.redact import redact_url as redact_any_url

log = logging.getLogger(__name__)

T = TypeVar("T")

# (type, default, environment variable) of each pool option read from the URL.
POOL_OPTIONS: Final[dict[str, tuple[type, float, str]]] = {
    "pool_size": (int, 2, "VCDL_LEDGER_POOL_SIZE"),
    "max_overflow": (int, 8, "VCDL_LEDGER_MAX_OVERFLOW"),
    "pool_recycle": (int, 1800, "VCDL_LEDGER_POOL_RECYCLE"),
    "pool_timeout": (float, 30, "VCDL_LEDGER_POOL_TIMEOUT"),
    "pool_ping_idle": (float, 1, "VCDL_LEDGER_POOL_PING_IDLE"),
}
# Where a pooled connection's record keeps when it last went idle.
_IDLE_SINCE: Final = "vcdl_idle_since"
# Execution option that marks read-only connections: on SQLite they open with
# a plain (deferred) BEGIN, so readers never queue behind the write lock.
_READ_ONLY: Final = "vcdl_read_only"
# Advisory lock key (with the schema's hash as the second key) that serializes
# schema upgrades between processes opening the same PostgreSQL ledger.
_SCHEMA_LOCK_KEY: Final = 0x7663646C  # "vcdl"
_URL_HELP: Final = "sqlite:///path/ledger.db or postgresql+psycopg://user:password@host:5432/db"


def redact_url(url: str | URL) -> str:
    """``url`` with its password and secret query values replaced by ``***``: the only form
    that may be shown (:func:`vcdl.redact.redact_url` on what SQLAlchemy parsed)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        # The parse error would echo the whole string, password included.
        return "<unparseable database URL>"
    return redact_any_url(parsed.render_as_string(hide_password=False))


def _pool_options(url: URL, display: str) -> tuple[URL, dict[str, Any]]:
    """``url`` without vcdl's pool parameters, and those parameters' values."""
    options: dict[str, Any] = {}
    for name, (kind, default, env) in POOL_OPTIONS.items():
        raw = url.query.get(name, os.environ.get(env))
        if isinstance(raw, tuple):
            raw = raw[-1]
        try:
            value = kind(raw) if raw is not None else kind(default)
            if value < 0:
                raise ValueError
        except ValueError:
            where = f"URL parameter {name}" if name in url.query else f"${env}"
            raise LedgerError(
                f"ledger {display}: {where} must be a number >= 0, got {raw!r}"
            ) from None
        options[name] = value
    return url.difference_update_query(POOL_OPTIONS), options


class LedgerEngine:
    """One ledger database: its engines, its transactions and its schema.

    ``url`` as for :class:`vcdl.ledger.Ledger`. Raises :class:`LedgerError`
    (never showing the password) for a URL that cannot be parsed or a
    backend that is not supported; connects only in :meth:`ensure_schema`.
    With ``create=False`` an SQLite file that does not exist raises
    :class:`LedgerNotFound` (and no directory is made for it).
    """

    def __init__(self, url: str, *, create: bool = True) -> None:
        self._create = create
        # The SQLite file, read on its own before the engine opens it (ensure_schema).
        self._sqlite_file: Path | None = None
        try:
            parsed = make_url(url)
        except ArgumentError as exc:
            raise UnsupportedLedger(f"cannot parse the ledger URL; expected {_URL_HELP}") from exc
        if parsed.drivername == "postgresql":
            # Only psycopg 3 is a dependency; SQLAlchemy's default is psycopg2.
            parsed = parsed.set(drivername="postgresql+psycopg")
        self.display = redact_url(parsed)
        self.backend = parsed.get_backend_name()
        self._secret = parsed.password if isinstance(parsed.password, str) else None
        parsed, pool = _pool_options(parsed, self.display)
        self.engine = self._make_engine(parsed, pool)
        self.read_engine: Engine
        self.single_engine: Engine
        if self.backend == "postgresql":
            # One statement, one transaction, one round trip: no BEGIN/COMMIT
            # trips, and no client time inside the transaction.
            self.read_engine = self.engine.execution_options(isolation_level="AUTOCOMMIT")
            self.single_engine = self.read_engine
        else:
            self.read_engine = self.engine.execution_options(**{_READ_ONLY: True})
            self.single_engine = self.engine

    def _make_engine(self, url: URL, pool: dict[str, Any]) -> Engine:
        if self.backend == "sqlite":
            db = url.database
            pool.pop("pool_ping_idle")  # a file does not hang up
            if not db or db == ":memory:" or db.startswith("file:"):
                pool = {}  # SQLAlchemy picks a single-connection pool for these
            elif not self._create and not Path(db).expanduser().is_file():
                raise LedgerNotFound(_missing(f"no ledger file {db}"))
            elif not self._create and Path(db).expanduser().stat().st_size == 0:
                # Connecting would write SQLite's header (the WAL pragma) into it:
                # a command that only reads must leave the file as it found it.
                raise LedgerNotFound(
                    _missing(f"ledger file {db} is empty: it holds no vcdl tables")
                )
            else:
                Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
            if db and db != ":memory:" and not db.startswith("file:"):
                self._sqlite_file = Path(db).expanduser()
            engine = create_engine(url, connect_args={"timeout": 30}, **pool)
            event.listen(engine, "connect", _sqlite_on_connect)
            event.listen(engine, "begin", _sqlite_on_begin)
            return engine
        if self.backend == "postgresql":
            try:
                import psycopg  # noqa: F401  (SQLAlchemy would fail later, less clearly)
            except ModuleNotFoundError:
                raise LedgerError(
                    f"ledger {self.display}: a PostgreSQL ledger needs psycopg 3, which is not "
                    "installed; install vcdl with its postgres extra "
                    "(pip install -c constraints.txt '.[postgres]') or psycopg[binary]"
                ) from None
            url, connect_args = session_connect_args(url, self.display)
            if "connect_timeout" not in url.query:
                connect_args["connect_timeout"] = 10
            if "application_name" not in url.query:
                connect_args["application_name"] = "vcdl"
            ping_idle = pool.pop("pool_ping_idle")
            # LIFO: a burst's extra connections go idle and are recycled instead
            # of being kept warm round-robin.
            engine = create_engine(
                url,
                pool_pre_ping=ping_idle == 0,
                pool_use_lifo=True,
                connect_args=connect_args,
                **pool,
            )
            if ping_idle > 0:
                _ping_when_idle(engine, ping_idle)
            return engine
        raise UnsupportedLedger(f"unsupported ledger URL {self.display}: use {_URL_HELP}")

    # -- transactions -------------------------------------------------------

    def read(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn``, which only reads, retried like :meth:`write`, and also after a lost
        connection at any point.

        One read-only transaction on SQLite; on PostgreSQL autocommit (each
        statement sees the latest committed state).
        """
        return self._transact(self.read_engine, fn, reads=True)

    def single(
        self,
        fn: Callable[[Connection], T],
        on_transient: Callable[[], LedgerError] | None = None,
    ) -> T:
        """Run ``fn``, whose only write is one statement, like :meth:`write`.

        On PostgreSQL ``fn`` runs in autocommit mode, every statement its own
        transaction; so ``fn`` must not write with a second statement (reads
        that explain a failure are fine), and a connection lost after it was
        sent is raised, not retried (the write may have been applied). On
        SQLite this is :meth:`write`.
        """
        autocommit = self.backend == "postgresql"
        return self._transact(self.single_engine, fn, on_transient, autocommit=autocommit)

    def write(
        self,
        fn: Callable[[Connection], T],
        on_transient: Callable[[], LedgerError] | None = None,
    ) -> T:
        """Run ``fn`` in one write transaction, committed if it returns.

        A PostgreSQL serialization failure or deadlock re-runs the transaction
        (it was rolled back whole), unless ``on_transient`` gives the error to
        raise instead. A connection lost before the commit was sent re-runs it
        too, with backoff (:mod:`vcdl.ledger.retry`); one lost during the
        commit is resolved on PostgreSQL (:mod:`vcdl.ledger.outcome`: returned
        if it committed, re-run if not, raised if the server cannot say) and
        raised on SQLite (a local file: its commit is not sent over a link).
        """
        return self._transact(self.engine, fn, on_transient)

    def _transact(
        self,
        engine: Engine,
        fn: Callable[[Connection], T],
        on_transient: Callable[[], LedgerError] | None = None,
        *,
        reads: bool = False,
        autocommit: bool = False,
    ) -> T:
        # Even reads can fail with a serialization error when the server's
        # default isolation is SERIALIZABLE, so every transaction may be re-run.
        service = ledger_outage(self.display)
        start, serial, lost = time.monotonic(), 0, 0
        # A PostgreSQL write learns its id, so that a commit lost on the way is resolved.
        resolvable = self.backend == "postgresql" and not (reads or autocommit)
        while True:
            phase: Phase = "connect"
            xid: int | None = None
            try:
                with engine.begin() as conn:
                    phase = "run"
                    if resolvable:
                        forget_id(conn)
                    result = fn(conn)
                    xid = transaction_id(conn) if resolvable else None
                    phase = "commit"
            except DBAPIError as exc:
                sqlstate = getattr(exc.orig, "sqlstate", None)
                transient = sqlstate in TRANSIENT_SQLSTATES
                if transient:
                    log.debug("ledger transaction hit SQLSTATE %s (try %d)", sqlstate, serial + 1)
                if transient and on_transient is not None:
                    raise on_transient() from exc
                if transient and serial + 1 < TRANSIENT_RETRIES:
                    transient_pause(serial)
                    serial += 1
                    continue
                if phase == "commit" and xid is not None and lost_connection(exc):
                    outcome = commit_outcome(engine, xid, service, began=start, n=lost)
                    if outcome == "committed":
                        service.succeeded(time.monotonic())
                        return result
                    if outcome == "aborted":  # nothing of it applied: run it again
                        lost += 1
                        continue
                    raise self.error(exc, "commit of unknown outcome to ledger") from exc
                if not wait_to_reconnect(
                    exc, phase, service, reads=reads, autocommit=autocommit, n=lost, began=start
                ):
                    raise self.error(exc) from exc
                lost += 1
                continue
            service.succeeded(time.monotonic())
            return result

    def error(self, exc: BaseException, doing: str = "") -> LedgerError:
        """The :class:`LedgerError` to raise for a database error; no password in it.

        ``exc`` is SQLAlchemy's :class:`DBAPIError` or the driver's own error.
        """
        detail = str(exc.orig if isinstance(exc, DBAPIError) else exc)
        if self._secret:
            detail = detail.replace(self._secret, "***")
        if "file is not a database" in detail or "file is encrypted" in detail:
            return not_a_database(self.display)
        if "database is locked" in detail:
            return LedgerError(
                f"ledger {self.display} stayed locked for 30 s; another process "
                "holds a long write transaction (or the file is on a network "
                "filesystem, where SQLite locking does not work: use PostgreSQL)"
            )
        return LedgerError(f"{doing or 'ledger'} {self.display}: {detail}")

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    # -- the schema -----------------------------------------------------------

    def ensure_schema(self, *, create: bool = True) -> None:
        """Bring the schema to the newest migration, creating it in an empty database.

        With ``create=False`` an empty database (no vcdl tables) raises
        :class:`LedgerNotFound` and is left as it was; an older schema is
        still upgraded (this vcdl cannot read it otherwise).

        At head already (every open but the first): one read. Otherwise one
        transaction under the schema lock — a PostgreSQL advisory lock per
        schema, or SQLite's write lock taken by ``BEGIN IMMEDIATE`` — so that
        processes opening a new or older ledger at once upgrade it once; the
        others wait, then find it at head.
        """
        head = migrations.head_revision()
        ours = migrations.LEDGER_TABLES | {migrations.VERSION_TABLE}
        if self._sqlite_file is not None:
            # Read-only first: the engine's connections switch the file to WAL as
            # they open, which would modify someone else's database before it is
            # refused.
            tables = sqlite_tables(self._sqlite_file, self.display)
            refuse_foreign(self.display, self.backend, tables or (), ours)
        try:
            with self.read_engine.connect() as conn:
                current = migrations.current_revision(conn)
                # A ledger from before migrations has its tables but no revision.
                empty = current is None and not migrations.has_ledger_tables(conn)
                # A ledger's database (or schema) is vcdl's alone: one with other
                # tables is someone else's, not to be written into.
                others = sorted(inspect(conn).get_table_names()) if empty else []
        except DBAPIError as exc:
            raise self.error(exc, "cannot open ledger") from exc
        refuse_foreign(self.display, self.backend, others, ours)
        if current == head:
            return
        if empty and not create:
            raise LedgerNotFound(_missing(f"ledger {self.display} holds no vcdl tables"))

        def upgrade(conn: Connection) -> str | None:
            if self.backend == "postgresql":
                # No statement timeout for an upgrade: a large ledger's may take
                # longer, and so may the wait of those queued on its lock.
                conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
                conn.exec_driver_sql(
                    f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK_KEY}, hashtext(current_schema()))"
                )
            return migrations.upgrade(conn, f"ledger {self.display}")

        before = self.write(upgrade)
        if before != head:
            log.info("ledger %s: schema %s -> %s", self.display, before or "(new)", head)


def _missing(what: str) -> str:
    return (
        f"{what}: no run has been trained with this ledger. Pass the run's --home "
        "(or --ledger / $VCDL_LEDGER_URL) to read an existing one; `vcdl train` creates one."
    )


def _ping_when_idle(engine: Engine, idle_seconds: float) -> None:
    """Pre-ping pooled connections that sat idle for ``idle_seconds`` or more.

    SQLAlchemy's recipe for custom pessimistic disconnect handling: a failed
    ping raises DisconnectionError, and the pool replaces the connection.
    """

    def fresh(_dbapi_connection: Any, record: Any) -> None:
        record.info[_IDLE_SINCE] = time.monotonic()

    def checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if time.monotonic() - record.info.get(_IDLE_SINCE, 0.0) < idle_seconds:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise DisconnectionError("ledger connection failed its ping") from exc
        if not alive:
            raise DisconnectionError("ledger connection failed its ping")

    event.listen(engine, "connect", fresh)
    event.listen(engine, "checkin", fresh)
    event.listen(engine, "checkout", checkout)


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Take transaction control away from pysqlite, so the begin hook below can
    # emit BEGIN IMMEDIATE itself (the recipe in SQLAlchemy's pysqlite docs).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA busy_timeout = 30000")
        # WAL: readers do not block the writer nor it them. Synchronous stays
        # FULL (the default): a preempted machine is a power cut, and a merge
        # that was reported committed must stay committed.
        _sqlite_wal(cursor)
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def _sqlite_wal(cursor: Any) -> None:
    # Switching a new file to WAL needs an exclusive lock, and SQLite does not
    # wait for it (no busy handler): processes opening a new ledger at once
    # got "database is locked" at once. Retry until the busy timeout instead.
    deadline = time.monotonic() + 30
    while True:
        try:
            if cursor.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal":
                return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                raise
        if time.monotonic() > deadline:
            raise sqlite3.OperationalError("database is locked (switching to WAL)")
        time.sleep(jitter(0.001, 0.02))


def _sqlite_on_begin(conn: Connection) -> None:
    # Writes take the write lock up front: a deferred BEGIN that reads and then
    # writes cannot wait for the lock (SQLite fails it at once to avoid a
    # deadlock), which gives "database is locked" under contention despite the
    # busy timeout (docs/stack.md). Read-only connections keep a deferred BEGIN.
    if conn.get_execution_options().get(_READ_ONLY):
        conn.exec_driver_sql("BEGIN")
    else:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


# -- the merge path, per backend -----------------------------------------------
