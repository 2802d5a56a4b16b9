"""The ledger contract suites' fixtures: every test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from vcdl.ledger import Ledger


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    return url


@pytest.fixture
def ledger(db_url: str) -> Iterator[Ledger]:
    led = Ledger(db_url)
    yield led
    led.close()
