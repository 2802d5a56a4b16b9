"""SQLite's merge path: the two ledger calls that need more than one statement.

Starting an attempt and committing a merge are, on SQLite, plain statements
in the caller's ``BEGIN IMMEDIATE`` transaction (SQLite's write lock
serializes whole transactions anyway). On PostgreSQL each is one statement in
autocommit mode, run on psycopg directly (:mod:`vcdl.ledger.pg`);
:mod:`vcdl.ledger.queries` gives both their meaning and their messages.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final, NamedTuple

from sqlalchemy import (
    Connection,
    case,
    func,
    insert,
    literal,
    select,
    update,
)

from vcdl.ledger.models import Version
from vcdl.ledger.pg import MERGE_DUPLICATE_SOURCES
from vcdl.ledger.rows import ATTEMPT as _ATT
from vcdl.ledger.rows import RUN as _RUN
from vcdl.ledger.rows import SUBTASK as _SUB
from vcdl.ledger.rows import VERSION as _VER
from vcdl.states import (
    MERGEABLE_ATTEMPT_STATES,
    SUBTASK_MOVES,
    TERMINAL_SUBTASK_STATES,
    sources,
)

# Subtask states a merge may start from, and attempt states a merge records
# as a duplicate (not a running one: its own finish does, vcdl.ledger.pg).
MERGE_SOURCES: Final = sources(SUBTASK_MOVES, "merged")
DUPLICATE_SOURCES: Final = MERGE_DUPLICATE_SOURCES


def start_attempt_row(
    c: Connection, values: dict[str, Any], base: int | None
) -> tuple[int, int, int] | None:
    """Insert the attempt ``values`` (run, epoch, shard, id, worker, worker_name, started_at,
    deadline).

    Returns its (subtask id, number, base version), or None if the subtask
    does not exist or there is no version ``base`` (then nothing was changed).
    SQLite's way, in the caller's ``BEGIN IMMEDIATE`` transaction; PostgreSQL's
    is one statement, :data:`vcdl.ledger.pg.START_ATTEMPT`.
    """
    head = select(_RUN.c.head_version).where(_RUN.c.name == values["run"]).scalar_subquery()
    counted = c.execute(
        update(_SUB)
        .where(
            _SUB.c.run == values["run"],
            _SUB.c.epoch == values["epoch"],
            _SUB.c.shard == values["shard"],
            literal(0 if base is None else base).between(0, head),
        )
        .values(
            attempts=_SUB.c.attempts + 1,
            state=case(
                (_SUB.c.state.in_(sorted(TERMINAL_SUBTASK_STATES)), _SUB.c.state),
                else_=literal("running"),
            ),
        )
        .returning(_SUB.c.id, _SUB.c.attempts, head)
    ).first()
    if counted is None:
        return None
    subtask_id, number, head_version = counted
    base = head_version if base is None else base
    c.execute(
        insert(_ATT).values(
            values | {"subtask_id": subtask_id, "number": number, "base_version": base}
        )
    )
    return subtask_id, number, base


class MergeRow(NamedTuple):
    """What :func:`commit_merge_row` did, read in this order.

    ``run`` is not the run asked for: nothing done. ``merged_version`` set:
    the subtask was merged before, the attempt is now a duplicate (or was the
    winner, ``state == "merged"``). ``state`` not mergeable, or
    ``subtask_state`` final: the lifecycle forbids the merge, nothing done.
    ``version_id`` set: merged as that version. Else: the head was not
    ``expected``, nothing done; ``head`` is the head when the statement
    already knows it (it had moved before the statement began), else None.
    """

    run: str
    subtask_id: int
    epoch: int
    state: str
    subtask_state: str
    merged_version: int | None
    version_id: int | None
    head: Version | None = None


def commit_merge_row(c: Connection, params: dict[str, Any]) -> MergeRow | None:
    """Merge as :data:`vcdl.ledger.pg.COMMIT_MERGE` does; None if there is no such attempt.

    SQLite's way: plain statements in the caller's ``BEGIN IMMEDIATE``
    transaction, which holds the write lock throughout. ``params``:
    attempt_id, run, expected, new, now, alpha, staleness, uri, checksum. A
    unique violation (the at-most-once backstop) propagates as
    :class:`~sqlalchemy.exc.IntegrityError`, with nothing changed.
    """
    aid, now, new = params["attempt_id"], params["now"], params["new"]
    found = c.execute(
        select(
            _ATT.c.run,
            _ATT.c.subtask_id,
            _ATT.c.epoch,
            _ATT.c.state,
            _SUB.c.state,
            _SUB.c.merged_version,
            _ATT.c.finished_at,
        )
        .join_from(_ATT, _SUB, _SUB.c.id == _ATT.c.subtask_id)
        .where(_ATT.c.id == aid)
    ).first()
    if found is None:
        return None
    row = MergeRow(*found[:6], version_id=None)
    if row.run != params["run"]:
        return row
    if row.merged_version is not None:
        return row._replace(state=mark_duplicate(c, aid, row.state, row.merged_version, now))
    if row.state not in MERGEABLE_ATTEMPT_STATES or row.subtask_state not in MERGE_SOURCES:
        return row
    cas = c.execute(
        update(_RUN)
        .where(_RUN.c.name == row.run, _RUN.c.head_version == params["expected"])
        .values(head_version=new, updated_at=now)
    )
    if cas.rowcount != 1:
        return row
    merged = {"state": "merged"} | ({} if found.finished_at else {"finished_at": now})
    c.execute(update(_ATT).where(_ATT.c.id == aid).values(merged))
    c.execute(
        update(_SUB)
        .where(_SUB.c.id == row.subtask_id)
        .values(state="merged", merged_version=new, reason=None)
    )
    version = {k: params[k] for k in ("alpha", "staleness", "uri", "checksum")} | {
        "run": row.run,
        "number": new,
        "parent": params["expected"],
        "subtask_id": row.subtask_id,
        "attempt_id": aid,
        "epoch": row.epoch,
        "created_at": now,
    }
    return row._replace(
        version_id=c.execute(insert(_VER).values(version).returning(_VER.c.id)).scalar()
    )


def mark_duplicate(
    c: Connection, attempt_id: str, state: str, merged_version: int, now: datetime
) -> str:
    """Record the attempt as a duplicate of ``merged_version``; return its state.

    Only from the states the lifecycle allows (vcdl.states): the winner
    itself, merged again by a retrying caller, stays merged; one already
    recorded as a duplicate stays so.
    """
    if state not in DUPLICATE_SOURCES:
        return state
    c.execute(
        update(_ATT)
        .where(_ATT.c.id == attempt_id)
        .values(
            state="duplicate",
            reason=f"subtask already merged as v{merged_version}",
            finished_at=func.coalesce(_ATT.c.finished_at, literal(now, _ATT.c.finished_at.type)),
        )
    )
    return "duplicate"
