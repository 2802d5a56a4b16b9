"""The ledger's versions and evaluations: the head, any version, an epoch's barrier head."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping

from sqlalchemy import Connection, func, insert, or_, select, update

from vcdl.ledger import models
from vcdl.ledger.base import _EVAL, _PG_HEAD, _VER, _VERSION_ROW, LedgerBase
from vcdl.ledger.models import (
    Evaluation,
    Version,
)


class VersionQueries(LedgerBase):
    """Versions and evaluations."""

    def head(self, name: str) -> Version:
        """The version the run's head points to."""
        if self._pg is not None:
            row = self._pg.fetch_one(_PG_HEAD, {"name": name}, repeatable=True)
            if row is not None:
                return _VERSION_ROW.load(row)
            # No such run (or no version row): the error, as SQLite finds it.
        return self._db.read(lambda c: self._head(c, name))

    def get_version(self, name: str, number: int) -> Version:
        """Version ``number`` of run ``name``."""
        return self._db.read(lambda c: self._get_version(c, name, number))

    def versions(self, name: str, *, epoch: int | None = None) -> list[Version]:
        """Every version of the run (of one epoch if given; v0 belongs to none), by number."""
        stmt = select(_VER).where(_VER.c.run == name)
        if epoch is not None:
            stmt = stmt.where(_VER.c.epoch == epoch)
        stmt = stmt.order_by(_VER.c.number)
        return self._db.read(lambda c: self._rows_of_run(c, Version, stmt, name))

    def mark_pruned(self, name: str, numbers: Iterable[int]) -> list[int]:
        """Record versions ``numbers`` as pruned now; returns those this call marked.

        The head and v0 are never marked, whatever is asked (the head may have
        moved since the caller looked: only forward, onto a version it did not
        ask about), nor a version marked already (a second gc finishing the
        first's work marks nothing twice). Marking comes *before* deleting the
        bytes (:mod:`vcdl.driver.gc`): a reader obeys the mark.
        """
        wanted = sorted({int(n) for n in numbers})

        def tx(c: Connection) -> list[int]:
            run = self._get_run(c, name)
            now = models.utcnow()
            marked: list[int] = []
            for i in range(0, len(wanted), 500):  # SQLite's bound on parameters
                stmt = (
                    update(_VER)
                    .where(
                        _VER.c.run == name,
                        _VER.c.number.in_(wanted[i : i + 500]),
                        _VER.c.number != run.head_version,
                        _VER.c.number != 0,
                        _VER.c.pruned_at.is_(None),
                    )
                    .values(pruned_at=now)
                    .returning(_VER.c.number)
                )
                marked.extend(int(n) for n in c.execute(stmt).scalars())
            return sorted(marked)

        return self._db.write(tx) if wanted else []

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

    def record_evaluation(
        self,
        name: str,
        version: int,
        epoch: int | None,
        split: str,
        accuracy: float | None,
        loss: float,
        samples: int,
        metrics: Mapping[str, float] | None = None,
    ) -> Evaluation:
        """Record version ``version``'s metrics on ``split``.

        ``loss`` for every objective; ``accuracy`` where the objective has one
        (else None); ``metrics``, every metric the objective reports.
        """
        every = {"loss": loss} | ({"accuracy": accuracy} if accuracy is not None else {})
        every |= dict(metrics or {})
        text = json.dumps({str(k): float(v) for k, v in every.items()}, sort_keys=True)

        def tx(c: Connection) -> Evaluation:
            self._get_version(c, name, version)
            evaluation = Evaluation(
                run=name,
                version=version,
                epoch=epoch,
                split=split,
                # A diverged model's NaN: NULL here on both backends (SQLite could
                # store nothing else), the NaN itself in metrics. Never a refused row.
                accuracy=None if accuracy is None or math.isnan(accuracy) else accuracy,
                loss=None if math.isnan(loss) else loss,
                samples=samples,
                metrics=text,
                created_at=models.utcnow(),
            )
            values = evaluation.model_dump(exclude={"id"})
            evaluation.id = c.execute(insert(_EVAL).values(values).returning(_EVAL.c.id)).scalar()
            return evaluation

        return self._db.write(tx)

    def evaluations(self, name: str) -> list[Evaluation]:
        """The run's evaluations in the order they were recorded."""
        stmt = select(_EVAL).where(_EVAL.c.run == name).order_by(_EVAL.c.id)
        return self._db.read(lambda c: self._rows_of_run(c, Evaluation, stmt, name))


def evaluation_metrics(evaluation: Evaluation) -> dict[str, float]:
    """Every metric of an evaluation: its recorded ones, or (older rows) loss and accuracy."""
    if evaluation.metrics:
        try:
            data = json.loads(evaluation.metrics)
            return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}
        except ValueError:
            pass
    out = {"loss": math.nan if evaluation.loss is None else evaluation.loss}
    if evaluation.accuracy is not None:
        out["accuracy"] = evaluation.accuracy
    return out
