"""PostgreSQL's merge path: the four hottest ledger statements, on psycopg directly.

This module owns how :class:`vcdl.ledger.Ledger` runs, on PostgreSQL, the
statements every merge makes — start an attempt, finish it, read the head,
commit the merge — and turns their rows into model objects. Their meaning and
their error messages stay in :mod:`vcdl.ledger`; SQLite runs the same calls
through SQLAlchemy (:mod:`vcdl.ledger.engine`).

Why not SQLAlchemy here: each of these calls is one statement in autocommit
mode, one round trip, and the server needs ~0.3 ms for it; SQLAlchemy's
``Connection`` around it (checkout, isolation level set and reset, result
metadata from ``cursor.description``, events, compiled-cache lookup) cost the
client ~0.7 ms more per call, the largest item of a merge's CPU when many
writers share a machine (benchmarks/ledger.py). Here a call is: a connection
from the engine's own pool (so pool size, pre-ping after idle, recycling and
the connection's keepalives and server timeouts, :mod:`vcdl.ledger.pgsession`,
are unchanged), ``autocommit`` on, one server-side prepared statement
(parsed and planned once per connection, then a generic plan; a URL's
``prepare_threshold=None`` turns this off), the tuple row read by position, the connection back.

Errors are handled as :meth:`vcdl.ledger.engine.LedgerEngine.single` does: a
serialization failure or deadlock re-runs the statement (or raises what the
caller's ``on_transient`` gives), a connection that could not be had is
waited for (:mod:`vcdl.ledger.retry`), a unique violation propagates as SQLAlchemy's
:class:`~sqlalchemy.exc.IntegrityError`, anything else becomes a
:class:`~vcdl.errors.LedgerError` without the password; a lost connection
invalidates the pool, so the next call reconnects.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

from sqlalchemy import Engine, Table
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlmodel import SQLModel

from vcdl.errors import LedgerError
from vcdl.ledger.models import UTCDateTime
from vcdl.ledger.retry import (
    TRANSIENT_RETRIES,
    TRANSIENT_SQLSTATES,
    Phase,
    ledger_outage,
    transient_pause,
    wait_to_reconnect,
)
from vcdl.ledger.rows import load
from vcdl.states import (
    ATTEMPT_MOVES,
    MERGEABLE_ATTEMPT_STATES,
    SUBTASK_MOVES,
    TERMINAL_SUBTASK_STATES,
    sources,
)

MERGED_BY_ANOTHER: Final = "by another attempt; this result came in after it"
"""The end of a result's reason when its own finish records it a duplicate."""

CLOSED_UNMERGED: Final = TERMINAL_SUBTASK_STATES - {"merged"}
"""Subtask states a result can no longer be merged in and no other attempt was:
its own finish records such a result rejected."""

CLOSED_UNMERGED_END: Final = ": nothing merges it"
"""The end of a result's reason when its own finish records it rejected
(``came in after its subtask was dropped: nothing merges it``)."""

MERGE_DUPLICATE_SOURCES: Final = sources(ATTEMPT_MOVES, "duplicate") - {"running"}
"""Attempt states a merge records as a duplicate of its subtask's version: not a
running attempt, which has no result yet; its own finish records it so
(:data:`FINISH_ATTEMPT`), and a duplicate cannot record its end any more."""

if TYPE_CHECKING:
    # Imported where a PostgreSQL ledger is opened: psycopg is the optional
    # ``postgres`` extra, and an SQLite ledger must not need it.
    import psycopg

__all__ = [
    "COMMIT_MERGE",
    "FINISH_ATTEMPT",
    "HEAD",
    "START_ATTEMPT",
    "PgFastPath",
    "RowLoader",
]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=SQLModel)


class RowLoader(Generic[M]):
    """Detached ``model`` objects from rows of ``table``'s columns in table order.

    :attr:`columns` is the select list (``table.col, ...``) that gives such
    rows; timestamps come back in the session's time zone and are made UTC,
    as :class:`~vcdl.ledger.models.UTCDateTime` does for SQLAlchemy.
    """

    def __init__(self, model: type[M], table: Table, alias: str | None = None) -> None:
        self.model = model
        self.names = tuple(c.name for c in table.columns)
        self._utc = tuple(i for i, c in enumerate(table.columns) if isinstance(c.type, UTCDateTime))
        prefix = alias or table.name
        self.columns = ", ".join(f"{prefix}.{name}" for name in self.names)

    def load(self, row: Sequence[Any]) -> M:
        """The model object of ``row`` (no validation: the values come from the database)."""
        values = dict(zip(self.names, row, strict=True))
        for i in self._utc:
            value = row[i]
            if isinstance(value, datetime):
                values[self.names[i]] = value.astimezone(UTC)
        return load(self.model, values)


def _sql_list(states: frozenset[str]) -> str:
    """A fixed set of states as an SQL list literal (sorted: one statement text)."""
    return "(" + ", ".join(f"'{s}'" for s in sorted(states)) + ")"


# Bumps the subtask's attempt count (its row lock makes concurrent starts take
# turns, so numbers are 1, 2, 3, ... without gaps) and inserts the attempt,
# based on %(base)s or, if NULL, on the head. No row: no such subtask, or no
# version %(base)s; nothing was changed.
START_ATTEMPT: Final = """
WITH head AS (
    SELECT head_version FROM run WHERE name = %(run)s
), counted AS (
    UPDATE subtask
    SET attempts = attempts + 1,
        state = CASE WHEN state IN {terminal} THEN state
                     ELSE 'running' END
    WHERE run = %(run)s AND epoch = %(epoch)s::integer AND shard = %(shard)s::integer
      AND COALESCE(%(base)s::integer, 0) BETWEEN 0 AND (SELECT head_version FROM head)
    RETURNING id, attempts
)
INSERT INTO attempt (id, run, subtask_id, epoch, shard, number, worker, worker_name,
                     base_version, state, started_at, deadline)
SELECT %(id)s, %(run)s, counted.id, %(epoch)s::integer, %(shard)s::integer, counted.attempts,
       %(worker)s, %(worker_name)s::varchar,
       COALESCE(%(base)s::integer, (SELECT head_version FROM head)), 'running',
       %(started_at)s::timestamptz, %(deadline)s::timestamptz
FROM counted
RETURNING subtask_id, number, base_version
""".replace("{terminal}", _sql_list(TERMINAL_SUBTASK_STATES))

# Sets the outcome; a NULL parameter keeps the column's value. One statement
# text whatever the caller gives, so one prepared statement. No row: no such
# attempt, or its state is not one of %(sources)s (the lifecycle's, vcdl.states).
# A result (%(state)s finished or interrupted) whose subtask another attempt
# merged already is recorded as a duplicate instead, in this statement: after
# the run's last settle nobody else would; one whose subtask was closed without
# a merge (dropped, failed) as rejected, for the same reason. The subtask's row is read FOR SHARE
# (only for a result): a merge of it in progress, which holds the row, is
# waited for and its outcome read; a merge that comes later waits for this
# statement, and its epoch's settle then finds the result. Read by id and then
# tested, not filtered by merged_version: a row the snapshot shows unmerged
# would be skipped without waiting for its lock.
_FINISH_ATTEMPT = """
WITH merged AS MATERIALIZED (
    SELECT subtask.merged_version AS number, subtask.state AS closed FROM subtask
    WHERE subtask.id = (SELECT subtask_id FROM attempt WHERE id = %(id)s)
      AND %(state)s::varchar IN {mergeable}
    FOR SHARE
)
UPDATE attempt
SET state = CASE WHEN (SELECT number FROM merged) IS NOT NULL THEN 'duplicate'
                 WHEN (SELECT closed FROM merged) IN {closed} THEN 'rejected'
                 ELSE %(state)s::varchar END,
    finished_at = %(now)s::timestamptz,
    result_uri = COALESCE(%(result_uri)s::varchar, result_uri),
    samples = COALESCE(%(samples)s::integer, samples),
    loss = COALESCE(%(loss)s::float8, loss),
    train_seconds = COALESCE(%(train_seconds)s::float8, train_seconds),
    reason = CASE WHEN (SELECT number FROM merged) IS NOT NULL
                  THEN 'subtask already merged as v' || (SELECT number FROM merged)
                       || ' {by_another}'
                  WHEN (SELECT closed FROM merged) IN {closed}
                  THEN 'came in after its subtask was ' || (SELECT closed FROM merged)
                       || '{closed_end}'
                  ELSE COALESCE(%(reason)s::varchar, reason) END,
    timings = COALESCE(%(timings)s::varchar, timings),
    data_bytes = COALESCE(%(data_bytes)s::bigint, data_bytes),
    data_requests = COALESCE(%(data_requests)s::integer, data_requests),
    written_bytes = COALESCE(%(written_bytes)s::bigint, written_bytes)
WHERE id = %(id)s AND state = ANY(%(sources)s)
RETURNING {columns}
"""
FINISH_ATTEMPT: Final = (
    _FINISH_ATTEMPT.replace("{mergeable}", _sql_list(MERGEABLE_ATTEMPT_STATES))
    .replace("{closed}", _sql_list(CLOSED_UNMERGED))
    .replace("{by_another}", MERGED_BY_ANOTHER)
    .replace("{closed_end}", CLOSED_UNMERGED_END)
)

# The run's head version row; none: no such run (or an inconsistent ledger).
HEAD: Final = """
SELECT {columns} FROM version
JOIN run ON run.name = version.run AND run.head_version = version.number
WHERE run.name = %(name)s
"""

# One merge, all or nothing. ``cur`` reads without locks: the attempt, whether
# its subtask is merged already (final once set, so an unlocked read is
# reliable) and whether the head is still %(expected)s. Only if the merge can
# succeed is the subtask locked (``target``): merges of one subtask queue there,
# always subtask before run, so two merges cannot deadlock; a lost race seen
# by the unlocked read costs no lock, no transaction id and no WAL flush. Then
# the compare-and-swap of the head from %(expected)s to %(new)s and, only if it
# swapped, the merged attempt and subtask and the new version; or, if the
# subtask was merged, the attempt recorded as a duplicate. The columns are
# those of vcdl.ledger.engine.MergeRow, then the head version's when it had
# moved before the statement began ({columns}, NULLs otherwise).
_COMMIT_MERGE = """
WITH cur AS (
    SELECT attempt.run, attempt.subtask_id, attempt.epoch, attempt.state,
           subtask.state AS subtask_state, subtask.merged_version, run.head_version AS head,
           run.head_version = %(expected)s::integer AS head_ok
    FROM attempt
    JOIN subtask ON subtask.id = attempt.subtask_id
    LEFT JOIN run ON run.name = %(run)s
    WHERE attempt.id = %(attempt_id)s
), target AS (
    SELECT id, merged_version FROM subtask
    WHERE id = (SELECT subtask_id FROM cur
                WHERE run = %(run)s AND merged_version IS NULL AND head_ok
                  AND state IN {mergeable} AND subtask_state IN {merge_sources})
    FOR UPDATE
), mergeable AS (
    SELECT id FROM target WHERE merged_version IS NULL
), cas AS (
    UPDATE run SET head_version = %(new)s::integer, updated_at = %(now)s::timestamptz
    WHERE name = %(run)s AND head_version = %(expected)s::integer
      AND EXISTS (SELECT FROM mergeable)
    RETURNING name
), merged_attempt AS (
    UPDATE attempt SET state = 'merged',
                       finished_at = COALESCE(finished_at, %(now)s::timestamptz)
    WHERE id = %(attempt_id)s AND EXISTS (SELECT FROM cas)
), merged_subtask AS (
    UPDATE subtask SET state = 'merged', merged_version = %(new)s::integer, reason = NULL
    WHERE id = (SELECT id FROM mergeable) AND EXISTS (SELECT FROM cas)
), duplicate AS (
    UPDATE attempt
    SET state = 'duplicate', reason = 'subtask already merged as v' || merged.number,
        finished_at = COALESCE(finished_at, %(now)s::timestamptz)
    FROM (SELECT COALESCE((SELECT merged_version FROM target),
                          (SELECT merged_version FROM cur)) AS number) AS merged
    WHERE attempt.id = %(attempt_id)s AND attempt.state IN {duplicate_sources}
      AND merged.number IS NOT NULL AND EXISTS (SELECT FROM cur WHERE run = %(run)s)
), new_version AS (
    INSERT INTO version (run, number, parent, subtask_id, attempt_id, epoch, alpha,
                         staleness, uri, checksum, created_at)
    SELECT %(run)s, %(new)s::integer, %(expected)s::integer, mergeable.id, %(attempt_id)s,
           (SELECT epoch FROM cur), %(alpha)s::float8, %(staleness)s::integer,
           %(uri)s, %(checksum)s, %(now)s::timestamptz
    FROM mergeable, cas
    RETURNING id
)
SELECT cur.run, cur.subtask_id, cur.epoch, cur.state, cur.subtask_state,
       COALESCE((SELECT merged_version FROM target), cur.merged_version) AS merged_version,
       (SELECT id FROM new_version) AS version_id,
       {columns}
FROM cur
LEFT JOIN version AS head
    ON NOT cur.head_ok AND head.run = %(run)s AND head.number = cur.head
"""
COMMIT_MERGE: Final = (
    _COMMIT_MERGE.replace("{mergeable}", _sql_list(MERGEABLE_ATTEMPT_STATES))
    .replace("{merge_sources}", _sql_list(sources(SUBTASK_MOVES, "merged")))
    .replace("{duplicate_sources}", _sql_list(MERGE_DUPLICATE_SOURCES))
)
# Columns of COMMIT_MERGE before the head version's.
COMMIT_MERGE_FIELDS: Final = 7


class PgFastPath:
    """Runs one statement per call on a pooled psycopg connection in autocommit mode.

    ``engine`` is the ledger's PostgreSQL engine (its pool and pool events are
    used as they are); ``error`` turns a database error into the
    :class:`LedgerError` to raise (password removed); ``display`` is the
    ledger's redacted URL, naming its outages in the log.
    """

    def __init__(
        self,
        engine: Engine,
        error: Callable[[BaseException], LedgerError],
        display: str = "postgresql",
    ) -> None:
        import psycopg

        self._display = display
        self._engine = engine
        self._error = error
        self._psycopg = psycopg

    def fetch_one(
        self,
        sql: str,
        params: Mapping[str, Any],
        on_transient: Callable[[], LedgerError] | None = None,
        *,
        repeatable: bool = False,
    ) -> tuple[Any, ...] | None:
        """The first row ``sql`` returns with ``params``, or None; committed when it returns.

        A connection that cannot be had is waited for with backoff; one lost after
        the statement was sent is too if the statement is ``repeatable`` (a read, or
        a write whose caller recognizes its own earlier effect), and raised
        otherwise (the write may have been applied: :mod:`vcdl.ledger.retry`).
        """
        service = ledger_outage(self._display)
        start, serial, lost = time.monotonic(), 0, 0
        while True:
            phase: list[Phase] = ["connect"]
            try:
                row = self._once(sql, params, phase)
            except self._psycopg.errors.IntegrityError as exc:
                raise IntegrityError(sql, dict(params), exc) from exc
            except (self._psycopg.Error, DBAPIError) as exc:
                sqlstate = getattr(getattr(exc, "orig", exc), "sqlstate", None)
                if sqlstate in TRANSIENT_SQLSTATES:
                    log.debug("ledger statement hit SQLSTATE %s (try %d)", sqlstate, serial + 1)
                    if on_transient is not None:
                        raise on_transient() from exc
                    if serial + 1 == TRANSIENT_RETRIES:
                        raise self._error(exc) from exc
                    transient_pause(serial)
                    serial += 1
                    continue
                if not wait_to_reconnect(
                    exc, phase[0], service, reads=repeatable, autocommit=True, n=lost, began=start
                ):
                    raise self._error(exc) from exc
                lost += 1
                continue
            service.succeeded(time.monotonic())
            return row

    def _once(
        self, sql: str, params: Mapping[str, Any], phase: list[Phase]
    ) -> tuple[Any, ...] | None:
        # A connection from the engine's pool: its checkout events (the ping
        # after idle) run as for any other ledger call.
        fairy = self._engine.raw_connection()
        phase[0] = "run"
        conn: psycopg.Connection[Any] = fairy.driver_connection  # type: ignore[assignment]
        try:
            # Autocommit: the statement is its own transaction, no BEGIN and
            # COMMIT round trips, and no client time inside the transaction.
            # Client-side only; put back before the pool has the connection,
            # which SQLAlchemy's own transactions expect not in autocommit.
            conn.autocommit = True
            try:
                # Prepared on first use rather than psycopg's fifth, unless
                # the URL turned preparing off (prepare_threshold=None, for
                # an old PgBouncer in transaction mode).
                prepare = None if conn.prepare_threshold is None else True
                cur = conn.execute(sql, params, prepare=prepare)
                row: tuple[Any, ...] | None = cur.fetchone()
            finally:
                if not (conn.closed or conn.broken):
                    conn.autocommit = False
        except self._psycopg.Error as exc:
            if conn.closed or conn.broken:
                # The server or the network hung up: drop this connection, and
                # the rest of the pool (they are likely dead too), as
                # SQLAlchemy does after a disconnect; the next call reconnects.
                fairy.invalidate(exc)
                self._engine.dispose()
            raise
        finally:
            fairy.close()
        return row
