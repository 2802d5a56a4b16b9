"""The ledger's runs and the driver lease: create, find, list, update; take and give up."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Connection, and_, case, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from vcdl.errors import LeaseHeld, LedgerError
from vcdl.ledger import models
from vcdl.ledger.base import _RUN, _VER, LedgerBase, _check_json
from vcdl.ledger.fence import lease_lost
from vcdl.ledger.models import (
    Run,
)
from vcdl.ledger.rows import many, one
from vcdl.states import (
    RUN_MOVES,
    RUN_STATES,
    check_run_move,
    sources,
)


class RunQueries(LedgerBase):
    """Runs and the driver lease."""

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
            now = models.utcnow()
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
                lease_generation=0,
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
        movable = sorted(sources(RUN_MOVES, state)) if state is not None else None
        if epochs_completed is not None and epochs_completed < 0:
            raise LedgerError(f"epochs_completed must be >= 0, got {epochs_completed}")
        given = {"state": state, "epochs_completed": epochs_completed, "config": config}
        values = {k: v for k, v in given.items() if v is not None} | {"updated_at": models.utcnow()}
        stmt = update(_RUN).where(_RUN.c.name == name)
        if movable is not None:
            stmt = stmt.where(_RUN.c.state.in_(movable))
        stmt = stmt.values(values).returning(_RUN)

        def tx(c: Connection) -> Run:
            run = one(c, Run, stmt)
            if run is None:
                old = self._get_run(c, name).state  # raises if there is no such run
                assert state is not None  # only a move can find no row of a run that exists
                check_run_move(old, state, f"run {name!r}")
            assert run is not None
            return run

        return self._db.single(tx)

    def acquire_lease(self, name: str, owner: str, ttl_seconds: float) -> int:
        """Take the right to drive run ``name`` for ``ttl_seconds``; returns its generation.

        Succeeds if the lease is free, expired or already ``owner``'s; else
        :class:`LeaseHeld`. One conditional UPDATE, so two drivers cannot both
        win. Taking it from another owner, or from nobody, raises the run's
        lease generation by one: the fencing token of :meth:`fenced`. A driver
        keeps its lease with :meth:`renew_lease`, never by taking it again.
        """
        if ttl_seconds <= 0:
            raise LedgerError(f"lease ttl must be > 0 seconds, got {ttl_seconds}")
        now = models.utcnow()
        expires = now + timedelta(seconds=ttl_seconds)
        gen = _RUN.c.lease_generation
        same = and_(_RUN.c.lease_owner.is_not(None), _RUN.c.lease_owner == owner)

        def tx(c: Connection) -> int:
            taken = c.execute(
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
                .values(
                    lease_owner=owner,
                    lease_expires=expires,
                    lease_generation=case((same, gen), else_=gen + 1),
                )
                .returning(gen)
            ).scalar()
            if taken is not None:
                return int(taken)
            run = self._get_run(c, name)
            until = run.lease_expires.isoformat(timespec="seconds") if run.lease_expires else "?"
            raise LeaseHeld(
                f"run {name!r} is being driven by {run.lease_owner} until {until}; wait for "
                "it to finish, or stop that process and retry once its lease has expired"
            )

        return self._db.single(tx)

    def renew_lease(self, name: str, owner: str, generation: int, ttl_seconds: float) -> None:
        """Extend ``owner``'s lease of generation ``generation`` by ``ttl_seconds`` from now.

        Raises :class:`LeaseLost` if the run's lease has passed on since (to
        another driver, or let go and taken again): the caller must stop
        driving. A lease that expired but that nobody took is still renewed,
        as no other driver can have written meanwhile.
        """

        def tx(c: Connection) -> None:
            renewed = c.execute(
                update(_RUN)
                .where(
                    _RUN.c.name == name,
                    _RUN.c.lease_owner == owner,
                    _RUN.c.lease_generation == generation,
                )
                .values(lease_expires=models.utcnow() + timedelta(seconds=ttl_seconds))
            )
            if renewed.rowcount == 1:
                return
            run = self._get_run(c, name)
            raise lease_lost(name, generation, run.lease_owner, run.lease_generation)

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
