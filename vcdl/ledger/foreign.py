"""Databases that are not vcdl ledgers, recognised before anything is written to them.

A ledger URL may name someone else's database: an SQLite file of another
program, a PostgreSQL database (or schema) of another application. vcdl
refuses it (:class:`~vcdl.errors.NotALedger`, exit 2) and must leave it as it
found it: not a table added, and for SQLite not even the journal mode
switched to WAL, which the ledger's connections do as they open. So an SQLite
file is first read through a connection of its own, read-only
(:func:`sqlite_tables`), before the ledger's engine connects to it.

:func:`refuse_foreign` is the one judgement both backends share: tables, but
none of vcdl's and no revision, is someone else's database.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection
from pathlib import Path

from vcdl.errors import NotALedger

__all__ = ["not_a_database", "refuse_foreign", "sqlite_tables"]

# SQLite's words for a file that is no (readable) database.
_NOT_A_DATABASE = ("file is not a database", "file is encrypted")


def not_a_database(display: str) -> NotALedger:
    """The error for a ledger file that is no SQLite database at all."""
    return NotALedger(
        f"ledger {display}: the file is not an SQLite database (not a vcdl "
        "ledger); move it away, or pass the --home (or --ledger) of your runs"
    )


def sqlite_tables(path: Path, display: str) -> list[str] | None:
    """The tables of the SQLite file at ``path``, read without writing a byte of it.

    None where the file does not exist, is empty (a new ledger), or cannot be
    read this way (the ledger's own connection then says why). A file that is
    no SQLite database raises :class:`NotALedger`.
    """
    try:
        if path.stat().st_size == 0:
            return None
    except OSError:
        return None
    # mode=ro: SQLite opens the file read-only and never writes it (no journal
    # mode change, no recovery); the URI form needs an absolute, escaped path.
    uri = f"{path.resolve().as_uri()}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=5)
    except sqlite3.Error:
        return None
    try:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    except sqlite3.DatabaseError as exc:
        if any(words in str(exc) for words in _NOT_A_DATABASE):
            raise not_a_database(display) from None
        return None  # locked, a hot journal it may not roll back: the engine decides
    finally:
        conn.close()
    return sorted(str(r[0]) for r in rows)


def refuse_foreign(
    display: str, backend: str, tables: Collection[str], ledger_tables: Collection[str]
) -> None:
    """Raise :class:`NotALedger` for a database of other tables and none of vcdl's.

    ``ledger_tables``: vcdl's table names, and ``alembic_version``; one of
    them present makes the database vcdl's (a partial or older ledger is the
    migrations' to judge).
    """
    if not tables or set(tables) & set(ledger_tables):
        return
    others = sorted(tables)
    shown = ", ".join(others[:4]) + (", ..." if len(others) > 4 else "")
    if backend == "sqlite":
        raise NotALedger(
            f"ledger {display} is an SQLite database of other tables ({shown[:200]}) "
            "without vcdl's: not a vcdl ledger; pass the --home (or --ledger) of your "
            "runs, or a new file"
        )
    raise NotALedger(
        f"ledger {display} holds other tables ({shown[:200]}) without vcdl's: not a vcdl "
        "ledger; give vcdl a database of its own (CREATE DATABASE vcdl) or a schema of its "
        "own (CREATE SCHEMA vcdl, and ?options=-csearch_path%3Dvcdl in the URL)"
    )
