"""Schema migrations of the ledger, with Alembic, run by the ledger itself.

This package owns the ledger's schema history: ``versions/`` holds one Alembic
revision per schema change, ``env.py`` the environment they run in. Users
never run Alembic: :class:`vcdl.ledger.Ledger` calls :func:`upgrade` on open
(under a schema lock, see :func:`vcdl.ledger.engine.ensure_schema`), with a
:class:`~alembic.config.Config` built here in code, so no ``alembic.ini`` is
needed. A ledger created before migrations existed (tables made by
``SQLModel.metadata.create_all``, no ``alembic_version`` table) is recognised
and stamped at :data:`INITIAL_REVISION`, whose schema it already has, and then
upgraded like any other.

Adding a migration: see README.md beside this file
(``python -m vcdl.ledger.migrations revision -m "..."``).
"""

from __future__ import annotations

import logging
import sys
from functools import lru_cache
from pathlib import Path
from typing import Final

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, inspect

from vcdl.errors import NotALedger

__all__ = [
    "INITIAL_REVISION",
    "LEDGER_TABLES",
    "SCRIPT_LOCATION",
    "alembic_config",
    "current_revision",
    "head_revision",
    "upgrade",
]

log = logging.getLogger(__name__)

SCRIPT_LOCATION: Final = str(Path(__file__).resolve().parent)
# The revision whose schema is exactly what create_all made before migrations.
INITIAL_REVISION: Final = "0001"
LEDGER_TABLES: Final = frozenset({"run", "subtask", "attempt", "version", "evaluation"})
VERSION_TABLE: Final = "alembic_version"


def alembic_config(connection: Connection | None = None, url: str | None = None) -> Config:
    """An Alembic config for this package, built in code (no ini file).

    ``connection``: run in this connection and its current transaction.
    ``url``: else connect to this database (kept out of the ini-style options,
    where a ``%`` in the URL would be taken for interpolation).
    """
    cfg = Config(stdout=sys.stdout)  # the default is sys.stdout as of import time
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    # New revisions are named 0002_add_something.py, in order.
    cfg.set_main_option("file_template", "%%(rev)s_%%(slug)s")
    cfg.attributes["connection"] = connection
    cfg.attributes["url"] = url
    return cfg


@lru_cache(maxsize=1)
def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest revision this version of vcdl knows."""
    head = _scripts().get_current_head()
    assert head is not None, "vcdl/ledger/migrations/versions has no revision"
    return head


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at; None without an ``alembic_version`` table."""
    return MigrationContext.configure(connection).get_current_revision()


def has_ledger_tables(connection: Connection) -> bool:
    """True when any of the ledger's tables exists at ``connection``."""
    return bool(LEDGER_TABLES & set(inspect(connection).get_table_names()))


@lru_cache(maxsize=1)
def _initial_columns() -> dict[str, frozenset[str]]:
    """Each ledger table's columns at :data:`INITIAL_REVISION` (made in memory once)."""
    from sqlalchemy import create_engine

    engine = create_engine("sqlite://")
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), INITIAL_REVISION)
            found = inspect(conn)
            return {t: frozenset(c["name"] for c in found.get_columns(t)) for t in LEDGER_TABLES}
    finally:
        engine.dispose()


def _past_initial(connection: Connection) -> str:
    """The columns a migration-less ledger has beyond the first schema's ("" if none)."""
    found = inspect(connection)
    extra = []
    for table, initial in sorted(_initial_columns().items()):
        more = sorted({c["name"] for c in found.get_columns(table)} - initial)
        extra += [f"{table}.{name}" for name in more]
    return ", ".join(extra[:4]) + (", ..." if len(extra) > 4 else "")


def upgrade(connection: Connection, display: str = "the ledger") -> str | None:
    """Bring the schema at ``connection`` to the head revision; return the revision it was at.

    The caller holds the schema lock and commits. An empty database gets every
    revision; a pre-migration ledger is stamped at :data:`INITIAL_REVISION`
    first; a database at a revision this vcdl does not know (written by a newer
    vcdl) is refused, not touched.
    """
    tables = set(inspect(connection).get_table_names())
    cfg = alembic_config(connection)
    before = current_revision(connection) if VERSION_TABLE in tables else None
    if before is None:
        present = LEDGER_TABLES & tables
        if present == LEDGER_TABLES:
            newer = _past_initial(connection)
            if newer:
                # Its alembic_version table was lost: stamping it 0001 would replay
                # migrations it already has ("duplicate column name: timings").
                raise NotALedger(
                    f"{display} has the ledger's tables but no alembic_version table, and "
                    f"columns newer than the first schema ({newer}): its schema revision "
                    "is unknown; restore the file (or its alembic_version table) from a "
                    "backup, or use a new ledger (another --home or --ledger)"
                )
            log.info("%s predates schema migrations: stamping it %s", display, INITIAL_REVISION)
            command.stamp(cfg, INITIAL_REVISION)
        elif present:
            raise NotALedger(
                f"{display} has only some of the ledger's tables ({', '.join(sorted(present))}) "
                "and no alembic_version table: not a ledger vcdl can upgrade; "
                "use an empty database or restore the missing tables"
            )
    else:
        try:
            _scripts().get_revision(before)
        except CommandError as exc:
            raise NotALedger(
                f"{display} has schema revision {before!r}, which this vcdl does not know "
                f"(its newest is {head_revision()!r}): it was written by a newer vcdl; "
                "upgrade vcdl on this machine"
            ) from exc
    if before != head_revision():
        command.upgrade(cfg, "head")
    return before
