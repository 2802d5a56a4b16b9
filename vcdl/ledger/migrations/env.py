"""Alembic environment of the ledger: run by :mod:`vcdl.ledger.migrations`, never by hand.

The ledger passes its own connection, already inside the transaction that
holds the schema lock, as ``config.attributes["connection"]``; the migrations
then run in that transaction and commit with it. Without one (the
``python -m vcdl.ledger.migrations`` helper), ``config.attributes["url"]`` names the
database. Offline mode (``--sql``) prints the DDL instead of running it.

Deliberately no ``logging.config.fileConfig``: the ledger runs this inside the
user's process, whose logging is not ours to reconfigure.
"""

from __future__ import annotations

from typing import Any, Literal

from alembic import context
from sqlalchemy import Connection, create_engine, pool
from sqlmodel import SQLModel
from sqlmodel.sql.sqltypes import AutoString

import vcdl.ledger.models  # noqa: F401  (registers the tables on SQLModel.metadata)
from vcdl.ledger.models import UTCDateTime

config = context.config
target_metadata = SQLModel.metadata


def _render_item(type_: str, obj: Any, autogen_context: Any) -> str | Literal[False]:
    # Migrations are frozen history: they must not import vcdl's current model
    # code, so render our column types as the plain SQLAlchemy types they map to.
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    if type_ == "type" and isinstance(obj, AutoString):
        return "sa.String()"
    return False


def _include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    # A database shared with other applications: never propose dropping their tables.
    return not (type_ == "table" and reflected and compare_to is None)


def _configure(**kwargs: Any) -> None:
    context.configure(
        target_metadata=target_metadata,
        compare_type=True,
        render_item=_render_item,
        include_object=_include_object,
        **kwargs,
    )


def _run(connection: Connection) -> None:
    # Batch mode: SQLite cannot ALTER most things in place; alembic's batch
    # operations copy the table instead. Harmless elsewhere.
    _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    _configure(url=config.attributes["url"], literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif config.attributes.get("connection") is not None:
    _run(config.attributes["connection"])
else:
    engine = create_engine(config.attributes["url"], poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()
