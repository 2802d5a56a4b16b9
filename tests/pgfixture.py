"""Database fixtures for ledger tests: ``sqlite_url`` and ``pg_url``.

A plain module (not a conftest) so tests/conftest.py can import the fixtures
and test modules can import them directly.

``pg_url`` gives each test its own empty PostgreSQL schema on the local server
(``postgresql+psycopg://postgres@127.0.0.1:5432/test``, trust auth; user
``root`` is tried too) and drops it afterwards. The schema is selected through
``search_path`` in the URL's ``options``, so the URL works unchanged in child
processes. A schema costs a few milliseconds; a database per test would cost a
copy of template1. Without a server the test is skipped, except under
``CI=true``, where a missing server is a broken CI job and fails.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["pg_url", "sqlite_url"]

PG_HOST = "127.0.0.1"
PG_PORT = 5432
PG_DB = "test"
PG_USERS = ("postgres", "root")


def _connect_admin() -> tuple[Any, str]:
    """An autocommit psycopg connection to the test database, and its user."""
    import psycopg  # the postgres extra; imported here so SQLite-only runs need not have it

    errors: list[str] = []
    for user in PG_USERS:
        try:
            conn = psycopg.connect(
                host=PG_HOST, port=PG_PORT, dbname=PG_DB, user=user, connect_timeout=3
            )
        except psycopg.Error as exc:
            errors.append(f"{user}: {' '.join(str(exc).split())}")
            continue
        conn.autocommit = True
        return conn, user
    raise ConnectionError("; ".join(errors))


def _unavailable(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: the PostgreSQL service must be up)", pytrace=False)
    pytest.skip(message)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL schema, dropped after the test."""
    try:
        admin, user = _connect_admin()
    except (ConnectionError, ImportError) as exc:
        _unavailable(f"PostgreSQL not reachable at {PG_HOST}:{PG_PORT}: {exc}")
        raise AssertionError("unreachable") from exc  # skip/fail raise; this is for mypy
    schema = f"vcdl_test_{uuid.uuid4().hex[:16]}"
    with admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            # %3D is "=": libpq's options string "-csearch_path=<schema>". The
            # application_name tags the test's connections for the cleanup.
            yield (
                f"postgresql+psycopg://{user}@{PG_HOST}:{PG_PORT}/{PG_DB}"
                f"?options=-csearch_path%3D{schema}&application_name={schema}"
            )
        finally:
            # A ledger a test forgot to close (or a killed child process) may
            # hold locks on the schema's tables; end those sessions first so
            # the DROP cannot hang.
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (schema,),
            )
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """URL of a not yet existing SQLite ledger file under the test's tmp dir."""
    return f"sqlite:///{tmp_path / 'ledger' / 'ledger.db'}"
