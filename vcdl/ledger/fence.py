"""Fencing: a driver's ledger writes carry its lease generation; stale ones are refused.

A lease alone cannot keep two drivers apart: a driver paused past its lease
(a VM paused for live migration, a laptop lid, a swap storm) wakes up
believing it still holds it, while another driver has taken the run over.
So every lease has a *generation* (``run.lease_generation``), raised by one
each time a driver takes the lease from another or from nobody, and a
driver's :class:`~vcdl.ledger.Ledger` is *fenced* with the generation it
took (:meth:`~vcdl.ledger.runs.RunQueries.fenced`): every write transaction
first checks, in the same transaction, that the run's generation is still
that one, and raises :class:`~vcdl.errors.LeaseLost` otherwise, changing
nothing (Kleppmann, "How to do distributed locking"; Chubby's sequencers).

Why the check is atomic with the write: on SQLite every write transaction
starts with ``BEGIN IMMEDIATE``, which holds the database's write lock until
it commits, so no lease can change hands in between. On PostgreSQL the check
reads the run's row ``FOR SHARE``: a driver taking the lease must UPDATE that
row and waits until the fenced transaction has committed, so a write is either
before the takeover or refused. A fenced ledger therefore runs every write in
a transaction, PostgreSQL's one-statement fast path included
(:mod:`vcdl.ledger.pg`): fencing costs the driver a round trip or two per
write, never correctness.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Connection, Select, literal_column, select

from vcdl.errors import LeaseLost, RunNotFound
from vcdl.ledger.engine import LedgerEngine
from vcdl.ledger.outcome import XID_SQL, note_id
from vcdl.ledger.rows import RUN as _RUN

T = TypeVar("T")


def lease_lost(run: str, generation: int, holder: str | None, current: int) -> LeaseLost:
    """The error for a write of ``generation`` when the run's lease is at ``current``."""
    who = f"driver {holder}" if holder else "another driver (which has since let it go)"
    return LeaseLost(
        f"run {run!r} was taken over by {who} (lease generation {current}; this driver held "
        f"{generation}): this driver stops, changing nothing more. `vcdl status {run}` shows "
        "the run; resume it with `vcdl resume` once no other driver runs it"
    )


class FencedEngine(LedgerEngine):
    """A :class:`LedgerEngine` whose writes check run ``run``'s lease generation first.

    Reads pass through unchanged; :meth:`write` and :meth:`single` run the
    check and the caller's function in one transaction (see the module's
    docstring). Everything else is the wrapped engine's (one engine, one pool).
    """

    def __init__(self, engine: LedgerEngine, run: str, generation: int) -> None:
        # Not LedgerEngine.__init__: this wraps an open engine, it opens nothing.
        self.inner = engine
        self.run = run
        self.generation = generation
        check: Select[Any] = select(_RUN.c.lease_generation, _RUN.c.lease_owner).where(
            _RUN.c.name == run
        )
        self._pg = engine.backend == "postgresql"
        # FOR SHARE on PostgreSQL: a takeover's UPDATE of the row waits for us. The
        # transaction's id in the same round trip: a commit lost on the way is then
        # resolved at no extra cost (vcdl.ledger.outcome).
        if self._pg:
            check = check.add_columns(literal_column(XID_SQL)).with_for_update(read=True)
        self._check = check

    def __getattr__(self, name: str) -> Any:
        # Only for what this object lacks: the wrapped engine's attributes.
        return getattr(self.inner, name)

    def check(self, c: Connection) -> None:
        """Raise :class:`LeaseLost` unless the run's generation is still ours (in ``c``'s tx)."""
        row = c.execute(self._check).first()
        if row is None:
            raise RunNotFound(f"no run {self.run!r} in ledger {self.inner.display}")
        if self._pg:
            note_id(c, row[2])
        if row[0] != self.generation:
            raise lease_lost(self.run, self.generation, row[1], int(row[0]))

    def _fenced(self, fn: Callable[[Connection], T]) -> Callable[[Connection], T]:
        def tx(c: Connection) -> T:
            self.check(c)
            return fn(c)

        return tx

    def read(self, fn: Callable[[Connection], T]) -> T:
        return self.inner.read(fn)

    def write(
        self,
        fn: Callable[[Connection], T],
        on_transient: Callable[[], Any] | None = None,
    ) -> T:
        return self.inner.write(self._fenced(fn), on_transient)

    def single(
        self,
        fn: Callable[[Connection], T],
        on_transient: Callable[[], Any] | None = None,
    ) -> T:
        # Never PostgreSQL's autocommit: the check must share the write's transaction.
        return self.inner.write(self._fenced(fn), on_transient)
