"""The ledger's record of the driver's decisions about a subtask that its attempts cannot show.

The epoch's state machine (:mod:`vcdl.driver.epoch_state`) decides things no
attempt row keeps: a task that a worker under a preemption notice handed
back before claiming an attempt, why a subtask was reissued, when it was
closed and why. ``flows/epoch.py`` records each such decision here, one small
insert on the fault path, so that ``vcdl story`` tells them after the driver
is gone (:mod:`vcdl.views.story`). At most
:data:`~vcdl.ledger.models.DECISIONS_PER_SUBTASK` per subtask: past it, the
first ones are kept and the next ones refused (a False answer, not an
error).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, func, insert, select

from vcdl.ledger import models
from vcdl.ledger.base import LedgerBase
from vcdl.ledger.models import DECISIONS_PER_SUBTASK, Decision
from vcdl.ledger.rows import TABLES

_DEC = TABLES["decision"]

DETAIL_CHARS = 1000
"""A decision's detail is cut to this many characters (a reason may quote an exception)."""


class DecisionQueries(LedgerBase):
    """The driver's decisions about subtasks (:class:`~vcdl.ledger.models.Decision`)."""

    def record_decision(
        self,
        name: str,
        epoch: int,
        shard: int,
        kind: str,
        detail: str = "",
        *,
        worker: str | None = None,
        at: datetime | None = None,
    ) -> bool:
        """Record a decision about subtask (``epoch``, ``shard``) of run ``name``.

        False, and nothing written, once the subtask has
        :data:`~vcdl.ledger.models.DECISIONS_PER_SUBTASK` decisions.

        Raises:
            RunNotFound: no run ``name``.
        """
        values = {
            "run": name,
            "epoch": epoch,
            "shard": shard,
            "kind": kind,
            "worker": worker or None,
            "detail": detail[:DETAIL_CHARS],
            "at": at or models.utcnow(),
        }
        mine = (_DEC.c.run == name, _DEC.c.epoch == epoch, _DEC.c.shard == shard)

        def tx(c: Connection) -> bool:
            kept = c.execute(select(func.count()).select_from(_DEC).where(*mine)).scalar_one()
            if kept >= DECISIONS_PER_SUBTASK:
                return False
            if kept == 0:
                self._check_run(c, name)  # the foreign key says so too, less plainly
            c.execute(insert(_DEC).values(values))
            return True

        return self._db.write(tx)

    def decisions(
        self, name: str, epoch: int | None = None, shard: int | None = None
    ) -> list[Decision]:
        """The run's decisions (of one epoch, one shard if given), by epoch, shard and time."""
        stmt = select(_DEC).where(_DEC.c.run == name)
        if epoch is not None:
            stmt = stmt.where(_DEC.c.epoch == epoch)
        if shard is not None:
            stmt = stmt.where(_DEC.c.shard == shard)
        stmt = stmt.order_by(_DEC.c.epoch, _DEC.c.shard, _DEC.c.at, _DEC.c.id)
        return self._db.read(lambda c: self._rows_of_run(c, Decision, stmt, name))
