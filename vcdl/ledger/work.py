"""The ledger's subtasks and attempts: what is left to do and what each execution did.

Every change of state goes through :mod:`vcdl.states`: the ledger refuses a
move its lifecycle does not allow, naming both states.

Just over 500 lines: a result that comes in after its subtask was merged is
recorded in its finish (one statement each backend); the next split is the
finish and start of an attempt into their own module.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import uuid4

from sqlalchemy import Connection, String, case, cast, func, literal, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from vcdl.errors import LedgerError
from vcdl.ledger import models
from vcdl.ledger.base import (
    _ATT,
    _ATTEMPT_ROW,
    _FINISH_FIELDS,
    _PG_FINISH_ATTEMPT,
    _RUN,
    _SUB,
    LedgerBase,
    _timings_json,
    attempt_timings,
)
from vcdl.ledger.models import (
    Attempt,
    Subtask,
)
from vcdl.ledger.pg import (
    CLOSED_UNMERGED,
    CLOSED_UNMERGED_END,
    MERGED_BY_ANOTHER,
    START_ATTEMPT,
)
from vcdl.ledger.rows import load, many, one
from vcdl.ledger.sqlite import (
    start_attempt_row,
)
from vcdl.states import (
    ATTEMPT_MOVES,
    ATTEMPT_STATES,
    MERGEABLE_ATTEMPT_STATES,
    SUBTASK_MOVES,
    SUBTASK_STATES,
    check_attempt_move,
    check_subtask_move,
    sources,
)


def _late_result_end(state: str, reason: str | None) -> dict[str, Any]:
    """The state and reason of a result that may come in after its subtask was closed.

    What :data:`vcdl.ledger.pg.FINISH_ATTEMPT` sets on PostgreSQL's fast path,
    for SQLAlchemy: a correlated read of the subtask's merged version and
    state, FOR SHARE on PostgreSQL (a fenced ledger) and inside SQLite's
    write lock. Merged by another attempt: a duplicate; closed without a
    merge (dropped, failed): rejected.
    """

    def subtask(column: Any) -> Any:
        return (
            select(column)
            .where(_SUB.c.id == _ATT.c.subtask_id)
            .with_for_update(read=True)
            .scalar_subquery()
        )

    merged, closed = subtask(_SUB.c.merged_version), subtask(_SUB.c.state)
    was_closed = closed.in_(sorted(CLOSED_UNMERGED))
    why = (
        literal("subtask already merged as v")
        + cast(merged, String)
        + literal(f" {MERGED_BY_ANOTHER}")
    )
    why_closed = literal("came in after its subtask was ") + closed + literal(CLOSED_UNMERGED_END)
    kept = _ATT.c.reason if reason is None else literal(reason, String)
    return {
        "state": case(
            (merged.is_not(None), literal("duplicate")),
            (was_closed, literal("rejected")),
            else_=literal(state, String),
        ),
        "reason": case((merged.is_not(None), why), (was_closed, why_closed), else_=kept),
    }


class WorkQueries(LedgerBase):
    """Subtasks and attempts."""

    def ensure_subtasks(
        self,
        name: str,
        epoch: int,
        shards: int,
        *,
        rows: Sequence[int] | None = None,
        workers: Sequence[str | None] | None = None,
    ) -> list[Subtask]:
        """Create the missing subtasks 0..shards-1 of ``epoch``; all of the epoch, by shard.

        Idempotent, and safe when several processes call it at once (the insert
        skips rows that exist, by the (run, epoch, shard) unique constraint).
        ``rows`` and ``workers`` (one per shard) record a throughput plan
        (``subtask.rows``, ``subtask.worker``); an epoch's existing subtasks
        keep the plan they were created with, so a resumed epoch trains the
        rows its first driver planned.
        """
        if epoch < 0 or shards < 1:
            raise LedgerError(f"need epoch >= 0 and shards >= 1, got epoch={epoch} shards={shards}")
        for given in (rows, workers):
            if given is not None and len(given) != shards:
                raise LedgerError(f"a plan needs one entry per shard ({shards}), got {len(given)}")
        dialect_insert = pg_insert if self.backend == "postgresql" else sqlite_insert

        def tx(c: Connection) -> list[Subtask]:
            self._check_run(c, name)
            rows_ = [
                {
                    "run": name,
                    "epoch": epoch,
                    "shard": k,
                    "state": "pending",
                    "attempts": 0,
                    "rows": rows[k] if rows is not None else None,
                    "worker": workers[k] if workers is not None else None,
                }
                for k in range(shards)
            ]
            c.execute(
                dialect_insert(_SUB)
                .values(rows_)
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
        shard: int | None = None,
    ) -> list[Subtask]:
        """The run's subtasks (of one epoch if given), by epoch and shard.

        ``exclude_states`` leaves out subtasks in those states, in the query:
        the open subtasks of a long run without loading every finished one.
        ``shard`` keeps that shard's, in the query too: a worker's claim reads
        its own row, not the epoch's (256 rows an attempt at 128 slots).
        """
        stmt = select(_SUB).where(_SUB.c.run == name)
        if epoch is not None:
            stmt = stmt.where(_SUB.c.epoch == epoch)
        if shard is not None:
            stmt = stmt.where(_SUB.c.shard == shard)
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

        # One conditional UPDATE: it cannot slip in after a concurrent merge,
        # nor move a subtask its lifecycle does not allow (vcdl.states).
        stmt = (
            update(_SUB)
            .where(
                _SUB.c.id == subtask_id,
                _SUB.c.merged_version.is_(None),
                _SUB.c.state.in_(sorted(sources(SUBTASK_MOVES, state))),
            )
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
            what = f"subtask {subtask_id} (epoch {sub.epoch}, shard {sub.shard})"
            if sub.merged_version is not None:
                raise LedgerError(f"{what} is merged as v{sub.merged_version}; its state is final")
            check_subtask_move(sub.state, state, what)
            raise AssertionError("unreachable: the move is allowed but changed nothing")

        return self._db.single(tx)

    def start_attempt(
        self,
        name: str,
        epoch: int,
        shard: int,
        worker: str,
        base_version: int | None = None,
        deadline: datetime | None = None,
        lease: int | None = None,
        worker_name: str | None = None,
    ) -> Attempt:
        """Record a new attempt at subtask (name, epoch, shard) and return it.

        The subtask's attempt count goes up and it becomes "running" unless it
        is already merged, dropped or failed; the attempt is recorded even then
        (duplicates are facts too). ``base_version`` defaults to the head read
        in the same transaction. ``lease``: the generation of the driver that
        submitted the attempt; the claim is refused (:class:`LeaseLost`) if
        the run's lease has passed on since (vcdl/ledger/fence.py).
        ``worker`` is the worker's address, ``worker_name`` its name where it
        has one that outlives the address (:mod:`vcdl.driver.throughput`).
        """
        if lease is not None:
            return self.fenced(name, lease).start_attempt(
                name, epoch, shard, worker, base_version, deadline, worker_name=worker_name
            )
        values: dict[str, Any] = {
            "id": uuid4().hex,
            "run": name,
            "epoch": epoch,
            "shard": shard,
            "worker": worker,
            "worker_name": worker_name,
            "started_at": models.utcnow(),
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
                | {"checkpoint_uri": None, "resumed_from": None, "resumed_seconds": None}
                | {"data_bytes": None, "data_requests": None, "written_bytes": None}
                | {"replay_inputs": None},
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
        data_bytes: int | None = None,
        data_requests: int | None = None,
        written_bytes: int | None = None,
    ) -> Attempt:
        """Record how an attempt ended; sets finished_at. Fields left None are kept.

        ``timings`` (seconds per phase) replaces the attempt's breakdown;
        :meth:`add_timings` adds phases to it later. ``data_bytes`` and
        ``data_requests``: training data the attempt fetched from the store
        and the GETs that fetched it; ``written_bytes``: tensors it wrote there.
        ``ended_at`` is when the attempt really ended if that is known to be earlier than now (e.g.
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
            "data_bytes": data_bytes,
            "data_requests": data_requests,
            "written_bytes": written_bytes,
        }
        now = models.utcnow()
        if ended_at is not None and ended_at < now:
            started = self.get_attempt(attempt_id).started_at
            now = max(ended_at, started)

        found = self._end_attempt(attempt_id, state, given, now, sources(ATTEMPT_MOVES, state))
        if isinstance(found, Attempt):
            return found
        if found == "merged":
            raise LedgerError(f"attempt {attempt_id} is merged; its state is final")
        check_attempt_move(found, state, f"attempt {attempt_id}")
        raise AssertionError("unreachable: the move is allowed but changed nothing")

    def abandon_attempt(
        self,
        attempt_id: str,
        *,
        state: str,
        reason: str,
        ended_at: datetime | None = None,
    ) -> Attempt | None:
        """Record that the driver gave up on a running attempt ("killed" or "timeout").

        Only while it is still running: an attempt that recorded its own end
        meanwhile (the driver's view was a moment old) keeps it, and None is
        returned. ``ended_at`` as for :meth:`finish_attempt`.
        """
        if state not in ("killed", "timeout"):
            raise LedgerError(f"an attempt is abandoned as killed or timeout, not {state!r}")
        now = models.utcnow()
        if ended_at is not None and ended_at < now:
            now = max(ended_at, self.get_attempt(attempt_id).started_at)
        given: dict[str, Any] = dict.fromkeys(_FINISH_FIELDS) | {"reason": reason}
        found = self._end_attempt(attempt_id, state, given, now, frozenset({"running"}))
        return found if isinstance(found, Attempt) else None

    def _end_attempt(
        self,
        attempt_id: str,
        state: str,
        given: Mapping[str, Any],
        now: datetime,
        allowed_from: frozenset[str],
    ) -> Attempt | str:
        """Set the attempt's end if its state is one of ``allowed_from``; else its state.

        A result (``state`` finished or interrupted) of a subtask that another
        attempt merged already is recorded as "duplicate" instead, in the same
        statement (:data:`vcdl.ledger.pg.FINISH_ATTEMPT` says how it cannot
        miss a merge under way).
        """
        if self._pg is not None:
            params = dict(given) | {
                "id": attempt_id,
                "state": state,
                "now": now,
                "sources": sorted(allowed_from),
            }
            row = self._pg.fetch_one(_PG_FINISH_ATTEMPT, params)
            if row is not None:
                return _ATTEMPT_ROW.load(row)
            return self.get_attempt(attempt_id).state  # raises if there is no such attempt
        values = {k: v for k, v in given.items() if v is not None}
        values |= {"state": state, "finished_at": now}
        if state in MERGEABLE_ATTEMPT_STATES:
            values |= _late_result_end(state, given.get("reason"))
        stmt = (
            update(_ATT)
            .where(_ATT.c.id == attempt_id, _ATT.c.state.in_(sorted(allowed_from)))
            .values(values)
            .returning(_ATT)
        )

        def tx(c: Connection) -> Attempt | str:
            attempt = one(c, Attempt, stmt)
            if attempt is not None:
                return attempt
            return self._get_attempt(c, attempt_id).state

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

    def record_replay_inputs(self, attempt_id: str, inputs: Mapping[str, object]) -> None:
        """Record what re-training attempt ``attempt_id`` needs (vcdl.replay), as JSON."""
        text = json.dumps(dict(inputs), sort_keys=True)
        self._db.single(
            lambda c: c.execute(
                update(_ATT).where(_ATT.c.id == attempt_id).values(replay_inputs=text)
            )
        )

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
        shard: int | None = None,
    ) -> list[Attempt]:
        """The run's attempts (of one epoch if given), by epoch, shard and number.

        ``states`` keeps those in these states; ``checkpointed`` those whose
        checkpoint is recorded; ``shard`` that shard's. All filter in the query:
        the driver asks at every epoch barrier, and a long run has tens of
        thousands of attempts; a worker's claim asks for its subtask's alone.
        """
        stmt = select(_ATT).where(_ATT.c.run == name)
        if epoch is not None:
            stmt = stmt.where(_ATT.c.epoch == epoch)
        if shard is not None:
            stmt = stmt.where(_ATT.c.shard == shard)
        if states is not None:
            stmt = stmt.where(_ATT.c.state.in_(sorted(states)))
        if checkpointed:
            stmt = stmt.where(_ATT.c.checkpoint_uri.is_not(None))
        stmt = stmt.order_by(_ATT.c.epoch, _ATT.c.shard, _ATT.c.number)
        return self._db.read(lambda c: self._rows_of_run(c, Attempt, stmt, name))
