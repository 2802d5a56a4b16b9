"""The ledger: every fact about runs, subtasks, attempts, versions and evaluations.

This module owns the queries and transactions on the tables of
:mod:`vcdl.ledger_models` (re-exported here), on SQLite (one machine, the
default) and PostgreSQL (several machines). It enforces the two rules the rest
of vcdl relies on (DESIGN.md §1):

* a subtask is merged at most once: :meth:`Ledger.commit_merge` checks under a
  row lock, and the unique constraint ``version(run, subtask_id)`` is the
  backstop when two mergers race anyway;
* the head moves only by compare-and-swap from the head the merge was computed
  on; a lost race is :class:`~vcdl.errors.HeadConflict`, which the caller
  answers by re-reading the head, merging again and retrying.

Every public method is one transaction and returns detached row objects (safe
to read after the call; changing them changes nothing in the ledger).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeVar

from sqlalchemy import Connection, Engine, and_, event, or_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError
from sqlmodel import Session, SQLModel, col, create_engine, select

from vcdl.errors import AlreadyMerged, HeadConflict, LeaseHeld, LedgerError, RunNotFound
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

__all__ = [
    "ATTEMPT_STATES",
    "RUN_STATES",
    "SUBTASK_STATES",
    "Attempt",
    "Evaluation",
    "Ledger",
    "Run",
    "Subtask",
    "Version",
    "redact_url",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

# Execution option that marks read-only sessions: on SQLite they open with a
# plain (deferred) BEGIN, so readers never queue behind the write lock.
_READ_ONLY: Final = "vcdl_read_only"
# PostgreSQL SQLSTATEs after which re-running the whole transaction is correct:
# serialization_failure and deadlock_detected.
_TRANSIENT_SQLSTATES: Final = frozenset({"40001", "40P01"})
_TRANSIENT_RETRIES: Final = 8
# Key of the advisory lock that serializes create_all between processes opening
# a fresh PostgreSQL ledger at once (concurrent CREATE TABLE fails otherwise).
_SCHEMA_LOCK_KEY: Final = 0x7663646C  # "vcdl"


def redact_url(url: str | URL) -> str:
    """``url`` with its password replaced by ``***``: the only form that may be shown."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        # The parse error would echo the whole string, password included.
        return "<unparseable database URL>"


class _LostRace(Exception):
    """Internal: the version insert hit a unique constraint inside commit_merge."""


class Ledger:
    """Runs, subtasks, attempts, versions and evaluations in one SQL database.

    ``url`` is an SQLAlchemy URL: ``sqlite:///path/ledger.db`` (the parent
    directory is created) or ``postgresql+psycopg://user:pw@host/db``
    (``postgresql://`` is taken to mean psycopg 3). Tables are created on open.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        try:
            parsed = make_url(url)
        except ArgumentError as exc:
            raise LedgerError(
                "cannot parse the ledger URL; expected sqlite:///path/ledger.db or "
                "postgresql+psycopg://user:password@host:5432/db"
            ) from exc
        if parsed.drivername == "postgresql":
            # Only psycopg 3 is a dependency; SQLAlchemy's default is psycopg2.
            parsed = parsed.set(drivername="postgresql+psycopg")
        self._display = parsed.render_as_string(hide_password=True)
        self._backend = parsed.get_backend_name()
        self._engine = self._make_engine(parsed)
        self._read_engine = self._engine.execution_options(**{_READ_ONLY: True})
        try:
            self._create_schema()
        except DBAPIError as exc:
            self._engine.dispose()
            raise LedgerError(f"cannot open ledger {self._display}: {exc.orig}") from exc
        log.debug("opened ledger %s", self._display)

    # -- plumbing -------------------------------------------------------------

    def _make_engine(self, url: URL) -> Engine:
        if self._backend == "sqlite":
            db = url.database
            if db and db != ":memory:" and not db.startswith("file:"):
                Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
            engine = create_engine(url, connect_args={"timeout": 30})
            event.listen(engine, "connect", _sqlite_on_connect)
            event.listen(engine, "begin", _sqlite_on_begin)
            return engine
        if self._backend == "postgresql":
            # A driver or CLI process holds a handful of connections at most;
            # pre_ping survives a restarted server or a dropped idle connection.
            return create_engine(
                url, pool_pre_ping=True, pool_size=5, max_overflow=5, pool_recycle=1800
            )
        raise LedgerError(
            f"unsupported ledger URL {self._display}: use sqlite:///path/ledger.db or "
            "postgresql+psycopg://user:password@host:5432/db"
        )

    def _create_schema(self) -> None:
        # One transaction (BEGIN IMMEDIATE on SQLite; an advisory lock on
        # PostgreSQL) so processes opening a fresh ledger together do not race
        # between "table missing?" and CREATE TABLE.
        with self._engine.begin() as conn:
            if self._backend == "postgresql":
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK_KEY})")
            SQLModel.metadata.create_all(conn)

    def _read(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn`` in one read-only transaction (retried like :meth:`_write`)."""
        return self._transact(self._read_engine, fn)

    def _write(
        self,
        fn: Callable[[Session], T],
        on_transient: Callable[[], LedgerError] | None = None,
    ) -> T:
        """Run ``fn`` in one write transaction, committed if it returns.

        A PostgreSQL serialization failure or deadlock re-runs the transaction
        (it was rolled back whole), unless ``on_transient`` gives the error to
        raise instead.
        """
        return self._transact(self._engine, fn, on_transient)

    def _transact(
        self,
        engine: Engine,
        fn: Callable[[Session], T],
        on_transient: Callable[[], LedgerError] | None = None,
    ) -> T:
        # Even reads can fail with a serialization error when the server's
        # default isolation is SERIALIZABLE, so every transaction may be re-run.
        for attempt in range(_TRANSIENT_RETRIES):
            try:
                with (
                    Session(engine, expire_on_commit=False) as session,
                    session.begin(),
                ):
                    return fn(session)
            except DBAPIError as exc:
                sqlstate = getattr(exc.orig, "sqlstate", None)
                transient = sqlstate in _TRANSIENT_SQLSTATES
                if transient:
                    log.debug("ledger transaction hit SQLSTATE %s (try %d)", sqlstate, attempt + 1)
                if transient and on_transient is not None:
                    raise on_transient() from exc
                if transient and attempt + 1 < _TRANSIENT_RETRIES:
                    time.sleep(random.uniform(0.005, 0.05) * (attempt + 1))
                    continue
                if "database is locked" in str(exc.orig):
                    raise LedgerError(
                        f"ledger {self._display} stayed locked for 30 s; another process "
                        "holds a long write transaction (or the file is on a network "
                        "filesystem, where SQLite locking does not work: use PostgreSQL)"
                    ) from exc
                raise LedgerError(f"ledger {self._display}: {exc.orig}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _not_found(self, name: str) -> RunNotFound:
        return RunNotFound(f"no run {name!r} in ledger {self._display}; `vcdl runs` lists them")

    def _get_run(self, session: Session, name: str) -> Run:
        run = session.get(Run, name)
        if run is None:
            raise self._not_found(name)
        return run

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
        return self._backend

    def __repr__(self) -> str:
        return f"Ledger({self._display!r})"

    def close(self) -> None:
        """Close every pooled connection. The object is unusable afterwards."""
        self._engine.dispose()

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

        def tx(s: Session) -> Run:
            if s.get(Run, name) is not None:
                raise exists
            if parent_run is not None:
                self._get_run(s, parent_run)
                self._get_version(s, parent_run, parent_version or 0)
            now = utcnow()
            run = Run(
                name=name,
                config=config,
                state="created",
                head_version=0,
                epochs_completed=0,
                parent_run=parent_run,
                parent_version=parent_version,
                created_at=now,
                updated_at=now,
            )
            s.add(run)
            try:
                # A concurrent create_run of the same name fails here.
                s.flush()
            except IntegrityError as exc:
                raise exists from exc
            s.add(
                Version(
                    run=name,
                    number=0,
                    parent=None,
                    uri=v0_uri,
                    checksum=v0_checksum,
                    created_at=now,
                )
            )
            return run

        return self._write(tx)

    def get_run(self, name: str) -> Run:
        """Run ``name``; :class:`RunNotFound` if there is none."""

        def tx(s: Session) -> Run:
            return self._get_run(s, name)

        return self._read(tx)

    def find_run(self, name: str) -> Run | None:
        """Run ``name``, or None."""

        def tx(s: Session) -> Run | None:
            return s.get(Run, name)

        return self._read(tx)

    def list_runs(self) -> list[Run]:
        """Every run, oldest first."""

        def tx(s: Session) -> list[Run]:
            return list(s.exec(select(Run).order_by(col(Run.created_at), col(Run.name))).all())

        return self._read(tx)

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

        def tx(s: Session) -> Run:
            run = self._get_run(s, name)
            if state is not None:
                run.state = state
            if epochs_completed is not None:
                run.epochs_completed = epochs_completed
            if config is not None:
                run.config = config
            run.updated_at = utcnow()
            return run

        return self._write(tx)

    # -- versions -------------------------------------------------------------

    def _get_version(self, s: Session, name: str, number: int) -> Version:
        version = s.exec(
            select(Version).where(col(Version.run) == name, col(Version.number) == number)
        ).first()
        if version is None:
            run = self._get_run(s, name)
            raise LedgerError(f"run {name!r} has no version {number} (head is v{run.head_version})")
        return version

    def head(self, name: str) -> Version:
        """The version the run's head points to."""

        def tx(s: Session) -> Version:
            version = s.exec(
                select(Version)
                .join(
                    Run,
                    and_(
                        col(Run.name) == col(Version.run),
                        col(Run.head_version) == col(Version.number),
                    ),
                )
                .where(col(Run.name) == name)
            ).first()
            if version is None:
                run = self._get_run(s, name)
                raise LedgerError(
                    f"head v{run.head_version} of run {name!r} has no version row; "
                    f"ledger {self._display} is inconsistent"
                )
            return version

        return self._read(tx)

    def get_version(self, name: str, number: int) -> Version:
        """Version ``number`` of run ``name``."""

        def tx(s: Session) -> Version:
            return self._get_version(s, name, number)

        return self._read(tx)

    def versions(self, name: str) -> list[Version]:
        """Every version of the run, by number."""

        def tx(s: Session) -> list[Version]:
            rows = list(
                s.exec(
                    select(Version).where(col(Version.run) == name).order_by(col(Version.number))
                ).all()
            )
            if not rows:
                self._get_run(s, name)
            return rows

        return self._read(tx)

    # -- subtasks -------------------------------------------------------------

    def ensure_subtasks(self, name: str, epoch: int, shards: int) -> list[Subtask]:
        """Create the missing subtasks 0..shards-1 of ``epoch``; all of the epoch, by shard.

        Idempotent, and safe when several processes call it at once (the insert
        skips rows that exist, by the (run, epoch, shard) unique constraint).
        """
        if epoch < 0 or shards < 1:
            raise LedgerError(f"need epoch >= 0 and shards >= 1, got epoch={epoch} shards={shards}")
        insert = pg_insert if self._backend == "postgresql" else sqlite_insert

        def tx(s: Session) -> list[Subtask]:
            self._get_run(s, name)
            rows = [
                {"run": name, "epoch": epoch, "shard": k, "state": "pending", "attempts": 0}
                for k in range(shards)
            ]
            s.exec(
                insert(Subtask)
                .values(rows)
                .on_conflict_do_nothing(index_elements=["run", "epoch", "shard"])
            )
            return list(
                s.exec(
                    select(Subtask)
                    .where(col(Subtask.run) == name, col(Subtask.epoch) == epoch)
                    .order_by(col(Subtask.shard))
                ).all()
            )

        return self._write(tx)

    def subtasks(self, name: str, epoch: int | None = None) -> list[Subtask]:
        """The run's subtasks (of one epoch if given), by epoch and shard."""

        def tx(s: Session) -> list[Subtask]:
            stmt = select(Subtask).where(col(Subtask.run) == name)
            if epoch is not None:
                stmt = stmt.where(col(Subtask.epoch) == epoch)
            rows = list(s.exec(stmt.order_by(col(Subtask.epoch), col(Subtask.shard))).all())
            if not rows:
                self._get_run(s, name)
            return rows

        return self._read(tx)

    def set_subtask_state(self, subtask_id: int, state: str, reason: str | None = None) -> Subtask:
        """Set a subtask's state (e.g. "dropped" by the quorum policy) and reason.

        "merged" is refused (only :meth:`commit_merge` merges), and so is any
        change to a merged subtask: a merge is final.
        """
        if state not in SUBTASK_STATES:
            raise LedgerError(f"invalid subtask state {state!r}; one of {sorted(SUBTASK_STATES)}")
        if state == "merged":
            raise LedgerError("a subtask becomes merged only through commit_merge")

        def tx(s: Session) -> Subtask:
            subtask = s.exec(
                select(Subtask).where(col(Subtask.id) == subtask_id).with_for_update()
            ).first()
            if subtask is None:
                raise LedgerError(f"no subtask with id {subtask_id} in ledger {self._display}")
            if subtask.merged_version is not None:
                raise LedgerError(
                    f"subtask {subtask_id} (epoch {subtask.epoch}, shard {subtask.shard}) is "
                    f"merged as v{subtask.merged_version}; its state is final"
                )
            subtask.state = state
            subtask.reason = reason
            return subtask

        return self._write(tx)

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

        def tx(s: Session) -> Attempt:
            run = self._get_run(s, name)
            # The row lock makes concurrent starts of one subtask take turns, so
            # attempt numbers are 1, 2, 3, ... without gaps or repeats.
            subtask = s.exec(
                select(Subtask)
                .where(
                    col(Subtask.run) == name,
                    col(Subtask.epoch) == epoch,
                    col(Subtask.shard) == shard,
                )
                .with_for_update()
            ).first()
            if subtask is None or subtask.id is None:
                raise LedgerError(
                    f"run {name!r} has no subtask epoch {epoch} shard {shard}; "
                    "ensure_subtasks() creates an epoch's subtasks"
                )
            base = run.head_version if base_version is None else base_version
            if not 0 <= base <= run.head_version:
                raise LedgerError(
                    f"base version {base} of run {name!r} does not exist "
                    f"(head is v{run.head_version})"
                )
            subtask.attempts += 1
            if subtask.state not in ("merged", "dropped", "failed"):
                subtask.state = "running"
            attempt = Attempt(
                run=name,
                subtask_id=subtask.id,
                epoch=epoch,
                shard=shard,
                number=subtask.attempts,
                worker=worker,
                base_version=base,
                state="running",
                started_at=utcnow(),
                deadline=deadline,
            )
            s.add(attempt)
            return attempt

        return self._write(tx)

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
    ) -> Attempt:
        """Record how an attempt ended; sets finished_at. Fields left None are kept.

        A merged attempt is final, and "merged" itself is set only by
        :meth:`commit_merge`.
        """
        if state not in ATTEMPT_STATES:
            raise LedgerError(f"invalid attempt state {state!r}; one of {sorted(ATTEMPT_STATES)}")
        if state == "merged":
            raise LedgerError("an attempt becomes merged only through commit_merge")

        def tx(s: Session) -> Attempt:
            attempt = self._get_attempt(s, attempt_id)
            if attempt.state == "merged":
                raise LedgerError(f"attempt {attempt_id} is merged; its state is final")
            attempt.state = state
            attempt.finished_at = utcnow()
            if result_uri is not None:
                attempt.result_uri = result_uri
            if samples is not None:
                attempt.samples = samples
            if loss is not None:
                attempt.loss = loss
            if train_seconds is not None:
                attempt.train_seconds = train_seconds
            if reason is not None:
                attempt.reason = reason
            return attempt

        return self._write(tx)

    def _get_attempt(self, s: Session, attempt_id: str) -> Attempt:
        attempt = s.get(Attempt, attempt_id)
        if attempt is None:
            raise LedgerError(f"no attempt {attempt_id!r} in ledger {self._display}")
        return attempt

    def get_attempt(self, attempt_id: str) -> Attempt:
        """Attempt ``attempt_id``."""

        def tx(s: Session) -> Attempt:
            return self._get_attempt(s, attempt_id)

        return self._read(tx)

    def attempts(self, name: str, epoch: int | None = None) -> list[Attempt]:
        """The run's attempts (of one epoch if given), by epoch, shard and number."""

        def tx(s: Session) -> list[Attempt]:
            stmt = select(Attempt).where(col(Attempt.run) == name)
            if epoch is not None:
                stmt = stmt.where(col(Attempt.epoch) == epoch)
            order = (col(Attempt.epoch), col(Attempt.shard), col(Attempt.number))
            rows = list(s.exec(stmt.order_by(*order)).all())
            if not rows:
                self._get_run(s, name)
            return rows

        return self._read(tx)

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
        ``expected_head``: re-read the head, merge onto it, and call again.
        """
        new = expected_head + 1

        def tx(s: Session) -> Version | tuple[int, str]:
            attempt = self._get_attempt(s, attempt_id)
            if attempt.run != name:
                raise LedgerError(
                    f"attempt {attempt_id} belongs to run {attempt.run!r}, not {name!r}"
                )
            # Lock the subtask before the run: merges of one subtask queue here
            # on PostgreSQL, so the check below sees any merge that committed
            # first. (SQLite's BEGIN IMMEDIATE already serializes everything.)
            # Always subtask-then-run, so no two merges can deadlock.
            subtask = s.exec(
                select(Subtask).where(col(Subtask.id) == attempt.subtask_id).with_for_update()
            ).one()
            now = utcnow()
            if subtask.merged_version is not None:
                _mark_duplicate(attempt, subtask.merged_version, now)
                # Committed, then AlreadyMerged below.
                return subtask.merged_version, attempt.state
            cas = s.exec(
                update(Run)
                .where(col(Run.name) == name, col(Run.head_version) == expected_head)
                .values(head_version=new, updated_at=now)
                .execution_options(synchronize_session=False)
            )
            if cas.rowcount != 1:
                run = self._get_run(s, name)
                raise HeadConflict(
                    f"head of run {name!r} is v{run.head_version}, not v{expected_head}: "
                    "re-read the head, merge onto it and retry"
                )
            version = Version(
                run=name,
                number=new,
                parent=expected_head,
                subtask_id=subtask.id,
                attempt_id=attempt.id,
                epoch=attempt.epoch,
                alpha=alpha,
                staleness=staleness,
                uri=uri,
                checksum=checksum,
                created_at=now,
            )
            s.add(version)
            try:
                s.flush()
            except IntegrityError as exc:
                raise _LostRace() from exc
            attempt.state = "merged"
            if attempt.finished_at is None:
                attempt.finished_at = now
            subtask.state = "merged"
            subtask.merged_version = new
            subtask.reason = None
            return version

        def conflict() -> LedgerError:
            return HeadConflict(
                f"run {name!r}: concurrent merges collided (serialization failure); "
                "re-read the head, merge onto it and retry"
            )

        try:
            result = self._write(tx, on_transient=conflict)
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

        def tx(s: Session) -> tuple[int, str] | None:
            attempt = self._get_attempt(s, attempt_id)
            version = s.exec(
                select(Version).where(
                    col(Version.run) == attempt.run, col(Version.subtask_id) == attempt.subtask_id
                )
            ).first()
            if version is None:
                return None
            _mark_duplicate(attempt, version.number, utcnow())
            return version.number, attempt.state

        return self._write(tx)

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

        def tx(s: Session) -> Evaluation:
            self._get_version(s, name, version)
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
            s.add(evaluation)
            return evaluation

        return self._write(tx)

    def evaluations(self, name: str) -> list[Evaluation]:
        """The run's evaluations in the order they were recorded."""

        def tx(s: Session) -> list[Evaluation]:
            rows = list(
                s.exec(
                    select(Evaluation)
                    .where(col(Evaluation.run) == name)
                    .order_by(col(Evaluation.id))
                ).all()
            )
            if not rows:
                self._get_run(s, name)
            return rows

        return self._read(tx)

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

        def tx(s: Session) -> None:
            cas = s.exec(
                update(Run)
                .where(
                    col(Run.name) == name,
                    or_(
                        col(Run.lease_owner).is_(None),
                        col(Run.lease_owner) == owner,
                        col(Run.lease_expires).is_(None),
                        col(Run.lease_expires) <= now,
                    ),
                )
                .values(lease_owner=owner, lease_expires=expires)
                .execution_options(synchronize_session=False)
            )
            if cas.rowcount == 1:
                return
            run = self._get_run(s, name)
            until = run.lease_expires.isoformat(timespec="seconds") if run.lease_expires else "?"
            raise LeaseHeld(
                f"run {name!r} is being driven by {run.lease_owner} until {until}; wait for "
                "it to finish, or stop that process and retry once its lease has expired"
            )

        self._write(tx)

    def release_lease(self, name: str, owner: str) -> None:
        """Give up ``owner``'s lease on the run; a no-op if ``owner`` does not hold it."""

        def tx(s: Session) -> None:
            cas = s.exec(
                update(Run)
                .where(col(Run.name) == name, col(Run.lease_owner) == owner)
                .values(lease_owner=None, lease_expires=None)
                .execution_options(synchronize_session=False)
            )
            if cas.rowcount == 0:
                self._get_run(s, name)

        self._write(tx)


def _check_json(name: str, config: str) -> None:
    try:
        json.loads(config)
    except ValueError as exc:
        raise LedgerError(f"config of run {name!r} is not JSON text: {exc}") from exc


def _mark_duplicate(attempt: Attempt, merged_version: int, now: datetime) -> None:
    if attempt.state == "merged":
        return  # the winner itself, merged again by a retrying caller: it stays merged
    attempt.state = "duplicate"
    attempt.reason = f"subtask already merged as v{merged_version}"
    if attempt.finished_at is None:
        attempt.finished_at = now


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
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def _sqlite_on_begin(conn: Connection) -> None:
    # Writes take the write lock up front: a deferred BEGIN that reads and then
    # writes cannot wait for the lock (SQLite fails it at once to avoid a
    # deadlock), which gives "database is locked" under contention despite the
    # busy timeout (STACK-NOTES). Read-only sessions keep a deferred BEGIN.
    if conn.get_execution_options().get(_READ_ONLY):
        conn.exec_driver_sql("BEGIN")
    else:
        conn.exec_driver_sql("BEGIN IMMEDIATE")
