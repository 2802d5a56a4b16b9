"""What every part of the :class:`~vcdl.ledger.queries.Ledger` shares: its database, its lookups.

The tables as Core tables, the PostgreSQL fast path's row loaders and
statements, and :class:`LedgerBase`: the open database (:mod:`vcdl.ledger.engine`),
the URL shown in messages, and the row lookups that raise the ledger's
errors. The queries themselves are the mixins of :mod:`vcdl.ledger.queries`.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

from sqlalchemy import Connection, Select, and_, bindparam, select
from sqlmodel import SQLModel

from vcdl.errors import LedgerError, RunNotFound, VersionNotFound
from vcdl.ledger.engine import LedgerEngine
from vcdl.ledger.fence import FencedEngine
from vcdl.ledger.models import (
    Attempt,
    Run,
    Version,
)
from vcdl.ledger.pg import (
    COMMIT_MERGE,
    FINISH_ATTEMPT,
    HEAD,
    PgFastPath,
    RowLoader,
)
from vcdl.ledger.rows import TABLES, many, one

_RUN, _SUB, _ATT, _VER, _EVAL = (
    TABLES[t] for t in ("run", "subtask", "attempt", "version", "evaluation")
)


M = TypeVar("M", bound=SQLModel)


# Rows of the PostgreSQL fast path (vcdl.ledger.pg) as model objects, and its
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


# The columns finish_attempt may set besides the state and finished_at.
_FINISH_FIELDS = (
    "result_uri",
    "samples",
    "loss",
    "train_seconds",
    "reason",
    "timings",
    "data_bytes",
    "data_requests",
    "written_bytes",
)


def _timings_json(timings: Mapping[str, float]) -> str:
    return json.dumps({str(k): round(float(v), 6) for k, v in timings.items()}, sort_keys=True)


log = logging.getLogger(__name__)


class LedgerBase:
    """The open database and the lookups every query needs (see :class:`Ledger`)."""

    def __init__(self, url: str, *, create: bool = True) -> None:
        self._url = url
        self._db: LedgerEngine = LedgerEngine(url, create=create)
        self._display = self._db.display
        self._engine = self._db.engine
        # PostgreSQL runs the merge path's statements on psycopg directly.
        self._pg = (
            PgFastPath(self._engine, self._db.error, self._db.display)
            if self.backend == "postgresql"
            else None
        )
        try:
            self._db.ensure_schema(create=create)
        except BaseException:
            self._db.dispose()
            raise
        log.debug("opened ledger %s", self._display)

    def fenced(self, name: str, generation: int) -> Self:
        """This ledger, every write of which is refused unless run ``name`` is at ``generation``.

        The driver's view of the ledger once it holds the lease
        (:mod:`vcdl.ledger.fence`): same engine and pool, no PostgreSQL fast
        path (a fenced write needs a transaction), reads unchanged.
        """
        view = copy.copy(self)
        inner = self._db.inner if isinstance(self._db, FencedEngine) else self._db
        view._db = FencedEngine(inner, name, generation)
        view._pg = None
        return view

    def check_lease(self, name: str) -> None:
        """Raise :class:`LeaseLost` if this ledger is fenced and run ``name`` has passed on.

        A read: for a driver that has nothing to write for a while (a no-op
        unfenced, or fenced for another run).
        """
        if isinstance(self._db, FencedEngine) and self._db.run == name:
            self._db.read(self._db.check)

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

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _get_version(self, c: Connection, name: str, number: int) -> Version:
        version = one(c, Version, select(_VER).where(_VER.c.run == name, _VER.c.number == number))
        if version is None:
            run = self._get_run(c, name)
            raise VersionNotFound(
                f"run {name!r} has no version {number} (head is v{run.head_version})"
            )
        return version

    def _head(self, c: Connection, name: str) -> Version:
        version = one(c, Version, _HEAD, {"name": name})
        if version is None:
            run = self._get_run(c, name)
            raise LedgerError(
                f"head v{run.head_version} of run {name!r} has no version row; "
                f"ledger {self._display} is inconsistent"
            )
        return version

    def _rows_of_run(self, c: Connection, model: type[M], stmt: Select[Any], name: str) -> list[M]:
        """The rows ``stmt`` selects as ``model``s; none only if the run exists."""
        rows = many(c, model, stmt)
        if not rows:
            self._check_run(c, name)
        return rows

    def _get_attempt(self, c: Connection, attempt_id: str) -> Attempt:
        attempt = one(c, Attempt, select(_ATT).where(_ATT.c.id == attempt_id))
        if attempt is None:
            raise LedgerError(f"no attempt {attempt_id!r} in ledger {self._display}")
        return attempt
