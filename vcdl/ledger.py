"""The ledger: every fact about runs, subtasks, attempts, versions and evaluations.

This module owns the queries and transactions on the tables of
:mod:`vcdl.ledger_models` (re-exported here), on SQLite (one machine, the
default) and PostgreSQL (several machines); connections, pools, retries and
the schema migrations on open live in :mod:`vcdl.ledger_engine`. It enforces
the two rules the rest of vcdl relies on (DESIGN.md §1):

* a subtask is merged at most once: :meth:`Ledger.commit_merge` checks under a
  row lock, and the unique constraint ``version(run, subtask_id)`` is the
  backstop when two mergers race anyway;
* the head moves only by compare-and-swap from the head the merge was computed
  on; a lost race is :class:`~vcdl.errors.HeadConflict`, which the caller
  answers by re-reading the head, merging again and retrying.

Every public method is one transaction and returns detached row objects (safe
to read after the call; changing them changes nothing in the ledger). The
queries are SQLAlchemy Core with ``RETURNING`` where it saves a round trip; on
PostgreSQL most calls are a single statement in autocommit mode. The merge
path (start_attempt, finish_attempt, head, commit_merge), which runs thousands
of times per epoch, is one statement per call there, run on psycopg directly
(:mod:`vcdl.ledger_pg`); SQLite runs it through SQLAlchemy
(:mod:`vcdl.ledger_engine`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar
from uuid import uuid4

from sqlalchemy import Connection, Select, and_, bindparam, func, insert, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlmodel import SQLModel

from vcdl.errors import AlreadyMerged, HeadConflict, LeaseHeld, LedgerError, RunNotFound
from vcdl.ledger_engine import (
    TABLES,
    LedgerEngine,
    MergeRow,
    commit_merge_row,
    load,
    many,
    mark_duplicate,
    one,
    redact_url,
    start_attempt_row,
)
from vcdl.ledger_models import (
    ATTEMPT_STATES,
    RUN_STATES,
    SUBTASK_STATES,
    Attempt,
    Evaluation,
    Run,
    Subtask,
    Version,
    utcnow,
)
from vcdl.ledger_pg import (
    COMMIT_MERGE,
    COMMIT_MERGE_FIELDS,
    FINISH_ATTEMPT,
    HEAD,
    START_ATTEMPT,
    PgFastPath,
    RowLoader,
)

__all__ = [
    "ATTEMPT_STATES",
    "RUN_STATES",
    "SUBTASK_STATES",
    "Attempt",
    "Evaluation",
    "HeadMoved",
    "Ledger",
    "Run",
    "Subtask",
    "Version",
    "attempt_timings",
    "redact_url",
]

log = logging.getLogger(__name__)

_RUN, _SUB, _ATT, _VER, _EVAL = (
    TABLES[t] for t in ("run", "subtask", "attempt", "version", "evaluation")
)

M = TypeVar("M", bound=SQLModel)

# Rows of the PostgreSQL fast path (vcdl.ledger_pg) as model objects, and its
# statements with their select lists filled in.
_ATTEMPT_ROW = RowLoader(Attempt, _ATT)
_VERSION_ROW = RowLoader(Version, _VER)
_HEAD_ROW = RowLoader(Version, _VER, alias="head")
_PG_FINISH_ATTEMPT = FINISH_ATTEMPT.format(columns=_ATTEMPT_ROW.columns)
_PG_HEAD = HEAD.format(columns=_VERSION_ROW.columns)
_PG_COMMIT_MERGE = COMMIT_MERGE.format(columns=_HEAD_ROW.columns)


# The head version row of run :name (prebuilt: the hottest read of all).
_HEAD = (
    select(_VER)
    .join(_RUN, and_(_RUN.c.name == _VER.c.run, _RUN.c.head_version == _VER.c.number))
    .where(_RUN.c.name == bindparam("name"))
)


class HeadMoved(HeadConflict):
    """The :class:`HeadConflict` of a merge onto a head that had moved on.

    ``head`` is the head :meth:`Ledger.commit_merge` found: merge onto it and
    retry, without reading the head again.
    """

    def __init__(self, message: str, head: Version) -> None:
        super().__init__(message)
        self.head = head

    def __reduce__(self) -> tuple[type[HeadMoved], tuple[str, Version]]:
        # Exceptions cross process boundaries (Dask, Prefect) by pickle.
        return type(self), (str(self), self.head)


class _LostRace(Exception):
    """Internal: the version insert hit a unique constraint inside commit_merge."""


class Ledger:
    """Runs, subtasks, attempts, versions and evaluations in one SQL database.

    ``url`` is an SQLAlchemy URL: ``sqlite:///path/ledger.db`` (the parent
    directory is created) or ``postgresql+psycopg://user:pw@host/db``
    (``postgresql://`` is taken to mean psycopg 3; pool settings in the query,
    see :mod:`vcdl.ledger_engine`). The schema is created or migrated to the
    newest revision on open; with ``create=False`` (read-only commands) a
    missing database or schema raises :class:`LedgerNotFound` instead, so a
    mistyped location is reported, not silently created empty.
    """

    def __init__(self, url: str, *, create: bool = True) -> None:
        self._url = url
        self._db = LedgerEngine(url, create=create)
        self._display = self._db.display
        self._engine = self._db.engine
        # PostgreSQL runs the merge path's statements on psycopg directly.
        self._pg = (
            PgFastPath(self._engine, self._db.error) if self.backend == "postgresql" else None
        )
        try:
            self._db.ensure_schema(create=create)
        except BaseException:
            self._db.dispose()
            raise
        log.debug("opened ledger %s", self._display)

    # -- plumbing -------------------------------------------------------------

    def _not_found(self, name: str) -> RunNotFound:
        return RunNotFound(f"no run {name!r} in ledger {self._display}; `vcdl runs` lists them")

    def _get_run(self, c: Connection, name: str) -> Run:
        run = one(c, Run, select(_RUN).where(_RUN.c.name == name))
        if run is None:
            raise self._not_found(name)
        return run

    def _check_run(self, c: Connection, name: str) -> None:
        if c.execute(select(_RUN.c.name).where(_RUN.c.name == name)).first() is None:
            raise self._not_found(name)

    # -- the ledger itself ----------------------------------------------------

    @property
    def url(self) -> str:
        """The URL as given, password included: pass it to processes, never show it."""
        return self._url

    @property
    def display_url(self) -> str:
        """The URL with its password hidden: for messages and logs."""
        return self._display

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._db.backend

    def __repr__(self) -> str:
        return f"Ledger({self._display!r})"

    def close(self) -> None:
        """Close every pooled connection. The object is unusable afterwards."""
        self._db.dispose()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- runs -----------------------------------------------------------------

    def create_run(
        self,
        name: str,
        config: str,
        v0_uri: str,
        v0_checksum: str,
        parent_run: str | None = None,
        parent_version: int | None = None,
    ) -> Run:
        """Insert run ``name`` (state "created", head v0) and its version 0, atomically."""
        if not name or name != name.strip():
            raise LedgerError(f"invalid run name {name!r}: non-empty, no surrounding spaces")
        _check_json(name, config)
        if (parent_run is None) != (parent_version is None):
            raise LedgerError(
                "give both parent_run and parent_version for a warm start, or neither"
            )
        exists = LedgerError(
            f"run {name!r} already exists in ledger {self._display}; "
            f"choose a new name (--run NEW) or resume {name!r}"
        )

        def tx(c: Connection) -> Run:
            if c.execute(select(_RUN.c.name).where(_RUN.c.name == name)).first() is not None:
                raise exists
            if parent_run is not None:
                self._get_version(c, parent_run, parent_version or 0)
            now = utcnow()
            run = Run(
                name=name,
                config=config,
                state="created",
                head_version=0,
                epochs_completed=0,
                parent_run=parent_run,
                parent_version=parent_version,
                lease_owner=None,
                lease_expires=None,
                created_at=now,
                updated_at=now,
            )
            try:
                # A concurrent create_run of the same name fails here.
                c.execute(insert(_RUN).values(run.model_dump()))
            except IntegrityError as exc:
                raise exists from exc
            c.execute(
                insert(_VER).values(
                    run=name,
                    number=0,
                    parent=None,
                    uri=v0_uri,
                    checksum=v0_checksum,
                    created_at=now,
                )
            )
            return run

        return self._db.write(tx)

    def get_run(self, name: str) -> Run:
        """Run ``name``; :class:`RunNotFound` if there is none."""
        return self._db.read(lambda c: self._get_run(c, name))

    def find_run(self, name: str) -> Run | None:
        """Run ``name``, or None."""

        return self._db.read(lambda c: one(c, Run, select(_RUN).where(_RUN.c.name == name)))

    def list_runs(self) -> list[Run]:
        """Every run, oldest first."""

        stmt = select(_RUN).order_by(_RUN.c.created_at, _RUN.c.name)
        return self._db.read(lambda c: many(c, Run, stmt))

    def update_run(
        self,
        name: str,
        *,
        state: str | None = None,
        epochs_completed: int | None = None,
        config: str | None = None,
    ) -> Run:
        """Set the run's state, epochs_completed and/or config (JSON text)."""
        if config is not None:
            _check_json(name, config)
        if state is not None and state not in RUN_STATES:
            raise LedgerError(f"invalid run state {state!r}; one of {sorted(RUN_STATES)}")
        if epochs_completed is not None and epochs_completed < 0:
            raise LedgerError(f"epochs_completed must be >= 0, got {epochs_completed}")
        given = {"state": state, "epochs_completed": epochs_completed, "config": config}
        values = {k: v for k, v in given.items() if v is not None} | {"updated_at": utcnow()}
        stmt = update(_RUN).where(_RUN.c.name == name).values(values).returning(_RUN)

        def tx(c: Connection) -> Run:
            run = one(c, Run, stmt)
            if run is None:
                raise self._not_found(name)
            return run

        return self._db.single(tx)

    # -- versions -------------------------------------------------------------

    def _get_version(self, c: Connection, name: str, number: int) -> Version:
        version = one(c, Version, select(_VER).where(_VER.c.run == name, _VER.c.number == number))
        if version is None:
            run = self._get_run(c, name)
            raise LedgerError(f"run {name!r} has no version {number} (head is v{run.head_version})")
        return version

    def head(self, name: str) -> Version:
        """The version the run's head points to."""
        if self._pg is not None:
            row = self._pg.fetch_one(_PG_HEAD, {"name": name})
            if row is not None:
                return _VERSION_ROW.load(row)
            # No such run (or no version row): the error, as SQLite finds it.
        return self._db.read(lambda c: self._head(c, name))

    def _head(self, c: Connection, name: str) -> Version:
        version = one(c, Version, _HEAD, {"name": name})
        if version is None:
            run = self._get_run(c, name)
            raise LedgerError(
                f"head v{run.head_version} of run {name!r} has no version row; "
                f"ledger {self._display} is inconsistent"
            )
        return version

    def get_version(self, name: str, number: int) -> Version:
        """Version ``number`` of run ``name``."""
        return self._db.read(lambda c: self._get_version(c, name, number))

    def versions(self, name: str) -> list[Version]:
        """Every version of the run, by number."""
        stmt = select(_VER).where(_VER.c.run == name).order_by(_VER.c.number)
        return self._db.read(lambda c: self._rows_of_run(c, Version, stmt, name))

    def barrier_head(self, name: str, epoch: int) -> int:
        """The version epoch ``epoch`` ended on: the newest of an epoch up to it (v0 has none).

        Versions of later epochs may already exist (the next epoch's merges
        run beside the barrier's evaluation) and are not part of it. One
        aggregate in the database: the driver asks at every barrier.

        Raises:
            RunNotFound: no run ``name``.
        """

        def read(c: Connection) -> int:
            self._check_run(c, name)
            stmt = select(func.max(_VER.c.number)).where(
                _VER.c.run == name, or_(_VER.c.epoch.is_(None), _VER.c.epoch <= epoch)
            )
            return int(c.execute(stmt).scalar_one())

        return self._db.read(read)

    def _rows_of_run(self, c: Connection, model: type[M], stmt: Select[Any], name: str) -> list[M]:
        """The rows ``stmt`` selects as ``model``s; none only if the run exists."""
        rows = many(c, model, stmt)
        if not rows:
            self._check_run(c, name)
        return rows

    # -- subtasks -------------------------------------------------------------

    def ensure_subtasks(self, name: str, epoch: int, shards: int) -> list[Subtask]:
        """Create the missing subtasks 0..shards-1 of ``epoch``; all of the epoch, by shard.

        Idempotent, and safe when several processes call it at once (the insert
        skips rows that exist, by the (run, epoch, shard) unique constraint).
        """
        if epoch < 0 or shards < 1:
            raise LedgerError(f"need epoch >= 0 and shards >= 1, got epoch={epoch} shards={shards}")
        dialect_insert = pg_insert if self.backend == "postgresql" else sqlite_insert

        def tx(c: Connection) -> list[Subtask]:
            self._check_run(c, name)
            rows = [
                {"run": name, "epoch": epoch, "shard": k, "state": "pending", "attempts": 0}
                for k in range(shards)
            ]
            c.execute(
                dialect_insert(_SUB)
                .values(rows)
                .on_conflict_do_nothing(index_elements=["run", "epoch", "shard"])
            )
            stmt = select(_SUB).where(_SUB.c.run == name, _SUB.c.epoch == epoch)
            return many(c, Subtask, stmt.order_by(_SUB.c.shard))

        return self._db.write(tx)

    def subtasks(
        self,
        name: str,
        epoch: int | None = None,
        *,
        exclude_states: Collection[str] = (),
    ) -> list[Subtask]:
        """The run's subtasks (of one epoch if given), by epoch and shard.

        ``exclude_states`` leaves out subtasks in those states, in the query:
        the open subtasks of a long run without loading every finished one.
        """
        stmt = select(_SUB).where(_SUB.c.run == name)
        if epoch is not None:
            stmt = stmt.where(_SUB.c.epoch == epoch)
        if exclude_states:
            stmt = stmt.where(_SUB.c.state.not_in(sorted(exclude_states)))
        stmt = stmt.order_by(_SUB.c.epoch, _SUB.c.shard)
        return self._db.read(lambda c: self._rows_of_run(c, Subtask, stmt, name))

    def count_subtasks(self, name: str, states: Collection[str]) -> int:
        """How many of the run's subtasks are in ``states`` (a count, no rows loaded).

        Raises:
            RunNotFound: no run ``name``.
        """

        def read(c: Connection) -> int:
            self._check_run(c, name)
            stmt = select(func.count()).where(_SUB.c.run == name, _SUB.c.state.in_(sorted(states)))
            return int(c.execute(stmt).scalar_one())

        return self._db.read(read)

    def set_subtask_state(self, subtask_id: int, state: str, reason: str | None = None) -> Subtask:
        """Set a subtask's state (e.g. "dropped" by the quorum policy) and reason.

        "merged" is refused (only :meth:`commit_merge` merges), and so is any
        change to a merged subtask: a merge is final.
        """
        if state not in SUBTASK_STATES:
            raise LedgerError(f"invalid subtask state {state!r}; one of {sorted(SUBTASK_STATES)}")
        if state == "merged":
            raise LedgerError("a subtask becomes merged only through commit_merge")

        # One conditional UPDATE: it cannot slip in after a concurrent merge.
        stmt = (
            update(_SUB)
            .where(_SUB.c.id == subtask_id, _SUB.c.merged_version.is_(None))
            .values(state=state, reason=reason)
            .returning(_SUB)
        )

        def tx(c: Connection) -> Subtask:
            subtask = one(c, Subtask, stmt)
            if subtask is not None:
                return subtask
            sub = c.execute(select(_SUB).where(_SUB.c.id == subtask_id)).first()
            if sub is None:
                raise LedgerError(f"no subtask with id {subtask_id} in ledger {self._display}")
            raise LedgerError(
                f"subtask {subtask_id} (epoch {sub.epoch}, shard {sub.shard}) is "
                f"merged as v{sub.merged_version}; its state is final"
            )

        return self._db.single(tx)

    # -- attempts -------------------------------------------------------------

    def start_attempt(
        self,
        name: str,
        epoch: int,
        shard: int,
        worker: str,
        base_version: int | None = None,
        deadline: datetime | None = None,
    ) -> Attempt:
        """Record a new attempt at subtask (name, epoch, shard) and return it.

        The subtask's attempt count goes up and it becomes "running" unless it
        is already merged, dropped or failed; the attempt is recorded even then
        (duplicates are facts too). ``base_version`` defaults to the head read
        in the same transaction.
        """
        values: dict[str, Any] = {
            "id": uuid4().hex,
            "run": name,
            "epoch": epoch,
            "shard": shard,
            "worker": worker,
            "started_at": utcnow(),
            "deadline": deadline,
        }

        def why_not(c: Connection) -> LedgerError:
            """Why nothing was started (the statement found no subtask or no base)."""
            head = c.execute(select(_RUN.c.head_version).where(_RUN.c.name == name)).scalar()
            if head is None:
                return self._not_found(name)
            if base_version is not None and not 0 <= base_version <= head:
                return LedgerError(
                    f"base version {base_version} of run {name!r} does not exist (head is v{head})"
                )
            return LedgerError(
                f"run {name!r} has no subtask epoch {epoch} shard {shard}; "
                "ensure_subtasks() creates an epoch's subtasks"
            )

        def started(row: tuple[int, int, int]) -> Attempt:
            subtask_id, number, base = row
            return load(
                Attempt,
                values
                | {"subtask_id": subtask_id, "number": number, "base_version": base}
                | {"state": "running", "finished_at": None, "reason": None, "result_uri": None}
                | {"samples": None, "loss": None, "train_seconds": None, "timings": None}
                | {"checkpoint_uri": None, "resumed_from": None, "resumed_seconds": None},
            )

        if self._pg is not None:
            pg_row = self._pg.fetch_one(START_ATTEMPT, values | {"base": base_version})
            if pg_row is None:
                raise self._db.read(why_not)
            return started((pg_row[0], pg_row[1], pg_row[2]))

        def tx(c: Connection) -> Attempt:
            row = start_attempt_row(c, values, base_version)
            if row is None:
                raise why_not(c)
            return started(row)

        return self._db.single(tx)

    def finish_attempt(
        self,
        attempt_id: str,
        *,
        state: str,
        result_uri: str | None = None,
        samples: int | None = None,
        loss: float | None = None,
        train_seconds: float | None = None,
        reason: str | None = None,
        timings: Mapping[str, float] | None = None,
        ended_at: datetime | None = None,
    ) -> Attempt:
        """Record how an attempt ended; sets finished_at. Fields left None are kept.

        ``timings`` (seconds per phase) replaces the attempt's breakdown;
        :meth:`add_timings` adds phases to it later. ``ended_at`` is when the
        attempt really ended if that is known to be earlier than now (e.g.
        the moment its worker died, found out later); it is clamped to
        [started_at, now], so clock skew never gives negative or future time.

        A merged attempt is final, and "merged" itself is set only by
        :meth:`commit_merge`.
        """
        if state not in ATTEMPT_STATES:
            raise LedgerError(f"invalid attempt state {state!r}; one of {sorted(ATTEMPT_STATES)}")
        if state == "merged":
            raise LedgerError("an attempt becomes merged only through commit_merge")
        given = {
            "result_uri": result_uri,
            "samples": samples,
            "loss": loss,
            "train_seconds": train_seconds,
            "reason": reason,
            "timings": _timings_json(timings) if timings is not None else None,
        }
        now = utcnow()
        if ended_at is not None and ended_at < now:
            started = self.get_attempt(attempt_id).started_at
            now = max(ended_at, started)

        def merged() -> LedgerError:
            return LedgerError(f"attempt {attempt_id} is merged; its state is final")

        if self._pg is not None:
            params = given | {"id": attempt_id, "state": state, "now": now}
            row = self._pg.fetch_one(_PG_FINISH_ATTEMPT, params)
            if row is not None:
                return _ATTEMPT_ROW.load(row)
            self.get_attempt(attempt_id)  # raises if there is no such attempt
            raise merged()
        values = {k: v for k, v in given.items() if v is not None}
        stmt = (
            update(_ATT)
            .where(_ATT.c.id == attempt_id, _ATT.c.state != "merged")
            .values(values | {"state": state, "finished_at": now})
            .returning(_ATT)
        )

        def tx(c: Connection) -> Attempt:
            attempt = one(c, Attempt, stmt)
            if attempt is not None:
                return attempt
            self._get_attempt(c, attempt_id)
            raise merged()

        return self._db.single(tx)

    def add_timings(self, attempt_id: str, timings: Mapping[str, float]) -> None:
        """Add phases (seconds) to an attempt's timing breakdown; a phase given again is summed."""
        if not timings:
            return

        def tx(c: Connection) -> None:
            attempt = self._get_attempt(c, attempt_id)
            merged = attempt_timings(attempt)
            for k, v in timings.items():
                merged[k] = merged.get(k, 0.0) + float(v)
            c.execute(
                update(_ATT).where(_ATT.c.id == attempt_id).values(timings=_timings_json(merged))
            )

        self._db.single(tx)

    def record_checkpoint(
        self, attempt_id: str, uri: str, samples: int, train_seconds: float
    ) -> str | None:
        """Point a running attempt at its newest checkpoint; returns the URI to delete.

        The attempt's ``samples`` and ``train_seconds`` become the checkpoint's
        (the training a replacement can resume). Returns the checkpoint this
        one replaces, or ``uri`` itself if the attempt is no longer running
        (the driver gave up on it): the ledger does not name it then.
        """

        def tx(c: Connection) -> str | None:
            attempt = self._get_attempt(c, attempt_id)
            if attempt.state != "running":
                return uri
            c.execute(
                update(_ATT)
                .where(_ATT.c.id == attempt_id)
                .values(checkpoint_uri=uri, samples=samples, train_seconds=train_seconds)
            )
            return attempt.checkpoint_uri

        return self._db.single(tx)

    def clear_checkpoint(self, attempt_id: str) -> str | None:
        """Forget an attempt's checkpoint; returns its URI (for the caller to delete)."""

        def tx(c: Connection) -> str | None:
            uri = self._get_attempt(c, attempt_id).checkpoint_uri
            if uri is not None:
                c.execute(update(_ATT).where(_ATT.c.id == attempt_id).values(checkpoint_uri=None))
            return uri

        return self._db.single(tx)

    def mark_resumed(self, attempt_id: str, source_id: str, seconds: float | None) -> None:
        """Record that attempt ``attempt_id`` started from ``source_id``'s checkpoint.

        ``seconds``: the checkpoint's ``train_seconds`` as read, the training
        of the source that the resumer salvages.
        """
        self._db.single(
            lambda c: c.execute(
                update(_ATT)
                .where(_ATT.c.id == attempt_id)
                .values(resumed_from=source_id, resumed_seconds=seconds)
            )
        )

    def _get_attempt(self, c: Connection, attempt_id: str) -> Attempt:
        attempt = one(c, Attempt, select(_ATT).where(_ATT.c.id == attempt_id))
        if attempt is None:
            raise LedgerError(f"no attempt {attempt_id!r} in ledger {self._display}")
        return attempt

    def get_attempt(self, attempt_id: str) -> Attempt:
        """Attempt ``attempt_id``."""
        return self._db.read(lambda c: self._get_attempt(c, attempt_id))

    def attempts(
        self,
        name: str,
        epoch: int | None = None,
        *,
        states: Collection[str] | None = None,
        checkpointed: bool = False,
    ) -> list[Attempt]:
        """The run's attempts (of one epoch if given), by epoch, shard and number.

        ``states`` keeps those in these states; ``checkpointed`` those whose
        checkpoint is recorded. Both filter in the query: the driver asks at
        every epoch barrier, and a long run has tens of thousands of attempts.
        """
        stmt = select(_ATT).where(_ATT.c.run == name)
        if epoch is not None:
            stmt = stmt.where(_ATT.c.epoch == epoch)
        if states is not None:
            stmt = stmt.where(_ATT.c.state.in_(sorted(states)))
        if checkpointed:
            stmt = stmt.where(_ATT.c.checkpoint_uri.is_not(None))
        stmt = stmt.order_by(_ATT.c.epoch, _ATT.c.shard, _ATT.c.number)
        return self._db.read(lambda c: self._rows_of_run(c, Attempt, stmt, name))

    # -- the merge ------------------------------------------------------------

    def commit_merge(
        self,
        name: str,
        attempt_id: str,
        *,
        expected_head: int,
        uri: str,
        checksum: str,
        alpha: float,
        staleness: int,
    ) -> Version:
        """Make the attempt's merged weights version ``expected_head + 1`` and the head.

        One transaction. Raises :class:`AlreadyMerged` (after marking the
        attempt "duplicate") if the subtask has a merged version, and
        :class:`HeadConflict` (changing nothing) if the head is no longer
        ``expected_head``: merge onto the current head and call again. That
        head comes with the error when it is known (:class:`HeadMoved`), so
        the retry need not read it again.
        """
        new, now = expected_head + 1, utcnow()
        params = {
            "attempt_id": attempt_id,
            "run": name,
            "expected": expected_head,
            "new": new,
            "now": now,
            "alpha": alpha,
            "staleness": staleness,
            "uri": uri,
            "checksum": checksum,
        }

        def outcome(
            row: MergeRow | None, read_head: Callable[[], Version]
        ) -> Version | tuple[int, str]:
            if row is None:
                raise LedgerError(f"no attempt {attempt_id!r} in ledger {self._display}")
            if row.run != name:
                raise LedgerError(f"attempt {attempt_id} belongs to run {row.run!r}, not {name!r}")
            if row.merged_version is not None:
                return row.merged_version, row.state  # AlreadyMerged, below
            if row.version_id is None:
                # The head as it is now: as the statement saw it, or a new read.
                head = row.head or read_head()
                raise HeadMoved(
                    f"head of run {name!r} is v{head.number}, not v{expected_head}: "
                    "merge onto that head and retry",
                    head,
                )
            version = {"id": row.version_id, "run": name, "number": new, "parent": expected_head}
            return load(
                Version,
                version
                | {"subtask_id": row.subtask_id, "attempt_id": attempt_id, "epoch": row.epoch}
                | {"alpha": alpha, "staleness": staleness, "uri": uri, "checksum": checksum}
                | {"created_at": now},
            )

        def conflict() -> LedgerError:
            return HeadConflict(
                f"run {name!r}: concurrent merges collided (serialization failure); "
                "re-read the head, merge onto it and retry"
            )

        def tx(c: Connection) -> Version | tuple[int, str]:
            try:
                row = commit_merge_row(c, params)
            except IntegrityError as exc:
                raise _LostRace() from exc
            return outcome(row, lambda: self._head(c, name))

        try:
            if self._pg is None:
                result = self._db.single(tx, on_transient=conflict)
            else:
                try:
                    pg_row = self._pg.fetch_one(_PG_COMMIT_MERGE, params, on_transient=conflict)
                except IntegrityError as exc:
                    raise _LostRace() from exc
                result = outcome(_merge_row(pg_row), lambda: self.head(name))
        except _LostRace as race:
            merged = self._after_lost_race(attempt_id)
            if merged is None:
                raise LedgerError(
                    f"merge of attempt {attempt_id} into run {name!r} as v{new} violated a "
                    f"constraint other than at-most-once: {race.__cause__}"
                ) from race
            result = merged
        if isinstance(result, tuple):
            number, state = result
            what = "it was this attempt" if state == "merged" else "attempt recorded as duplicate"
            raise AlreadyMerged(
                f"subtask of attempt {attempt_id} (run {name!r}) is already merged as "
                f"v{number}; {what}, nothing merged again"
            )
        return result

    def _after_lost_race(self, attempt_id: str) -> tuple[int, str] | None:
        """After a unique violation: mark the attempt duplicate if its subtask has a version.

        Returns that version's number and the attempt's state, or None when the
        violation was something else.
        """

        def tx(c: Connection) -> tuple[int, str] | None:
            attempt = self._get_attempt(c, attempt_id)
            number = c.execute(
                select(_VER.c.number).where(
                    _VER.c.run == attempt.run, _VER.c.subtask_id == attempt.subtask_id
                )
            ).scalar()
            if number is None:
                return None
            return number, mark_duplicate(c, attempt_id, attempt.state, number, utcnow())

        return self._db.write(tx)

    # -- evaluations ----------------------------------------------------------

    def record_evaluation(
        self,
        name: str,
        version: int,
        epoch: int | None,
        split: str,
        accuracy: float,
        loss: float,
        samples: int,
    ) -> Evaluation:
        """Record the accuracy and loss of version ``version`` on ``split``."""

        def tx(c: Connection) -> Evaluation:
            self._get_version(c, name, version)
            evaluation = Evaluation(
                run=name,
                version=version,
                epoch=epoch,
                split=split,
                accuracy=accuracy,
                loss=loss,
                samples=samples,
                created_at=utcnow(),
            )
            values = evaluation.model_dump(exclude={"id"})
            evaluation.id = c.execute(insert(_EVAL).values(values).returning(_EVAL.c.id)).scalar()
            return evaluation

        return self._db.write(tx)

    def evaluations(self, name: str) -> list[Evaluation]:
        """The run's evaluations in the order they were recorded."""
        stmt = select(_EVAL).where(_EVAL.c.run == name).order_by(_EVAL.c.id)
        return self._db.read(lambda c: self._rows_of_run(c, Evaluation, stmt, name))

    # -- the driver lease -----------------------------------------------------

    def acquire_lease(self, name: str, owner: str, ttl_seconds: float) -> None:
        """Take (or renew) the right to drive run ``name`` for ``ttl_seconds``.

        Succeeds if the lease is free, expired or already ``owner``'s; else
        :class:`LeaseHeld`. One conditional UPDATE, so two drivers cannot both win.
        """
        if ttl_seconds <= 0:
            raise LedgerError(f"lease ttl must be > 0 seconds, got {ttl_seconds}")
        now = utcnow()
        expires = now + timedelta(seconds=ttl_seconds)

        def tx(c: Connection) -> None:
            cas = c.execute(
                update(_RUN)
                .where(
                    _RUN.c.name == name,
                    or_(
                        _RUN.c.lease_owner.is_(None),
                        _RUN.c.lease_owner == owner,
                        _RUN.c.lease_expires.is_(None),
                        _RUN.c.lease_expires <= now,
                    ),
                )
                .values(lease_owner=owner, lease_expires=expires)
            )
            if cas.rowcount == 1:
                return
            run = self._get_run(c, name)
            until = run.lease_expires.isoformat(timespec="seconds") if run.lease_expires else "?"
            raise LeaseHeld(
                f"run {name!r} is being driven by {run.lease_owner} until {until}; wait for "
                "it to finish, or stop that process and retry once its lease has expired"
            )

        self._db.single(tx)

    def release_lease(self, name: str, owner: str) -> None:
        """Give up ``owner``'s lease on the run; a no-op if ``owner`` does not hold it."""

        def tx(c: Connection) -> None:
            cas = c.execute(
                update(_RUN)
                .where(_RUN.c.name == name, _RUN.c.lease_owner == owner)
                .values(lease_owner=None, lease_expires=None)
            )
            if cas.rowcount == 0:
                self._check_run(c, name)

        self._db.single(tx)


def _merge_row(row: tuple[Any, ...] | None) -> MergeRow | None:
    """The :class:`MergeRow` of a row of the PostgreSQL merge statement."""
    if row is None:
        return None
    fields, head = row[:COMMIT_MERGE_FIELDS], row[COMMIT_MERGE_FIELDS:]
    run, subtask_id, epoch, state, merged_version, version_id = fields
    return MergeRow(
        run,
        subtask_id,
        epoch,
        state,
        merged_version,
        version_id,
        None if head[0] is None else _HEAD_ROW.load(head),
    )


def _check_json(name: str, config: str) -> None:
    try:
        json.loads(config)
    except ValueError as exc:
        raise LedgerError(f"config of run {name!r} is not JSON text: {exc}") from exc


def attempt_timings(attempt: Attempt) -> dict[str, float]:
    """The attempt's seconds per phase (empty when it has none recorded)."""
    if not attempt.timings:
        return {}
    try:
        data = json.loads(attempt.timings)
    except ValueError:
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}


def _timings_json(timings: Mapping[str, float]) -> str:
    return json.dumps({str(k): round(float(v), 6) for k, v in timings.items()}, sort_keys=True)
