"""Shared fixtures: real services (loopback S3 from moto, PostgreSQL) and Prefect."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lanes import lane
from tests.pgfixture import *  # noqa: F403  (pg_url, sqlite_url fixtures)
from tests.s3fixture import *  # noqa: F403  (s3_endpoint, s3_bucket_url fixtures)
from tests.sigterm import pytest_sessionfinish, pytest_sessionstart  # noqa: F401  (SIGTERM tears the session down)

REPO = Path(__file__).resolve().parent.parent

# The tests' own model factories and objectives (tests.integration.broken_model,
# tests.unit.test_models, ...) are named by import path: the operator's
# allow-list (docs/configuration.md) lets them in, here and in every process
# the tests start (CLI subprocesses, Dask workers), which inherit it.
_allowed = [p for p in os.environ.get("VCDL_ALLOW_IMPORTS", "").split(",") if p.strip()]
os.environ["VCDL_ALLOW_IMPORTS"] = ",".join([*_allowed, "tests"])


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Prefect against a throwaway database for the whole session (one cold start)."""
    home = tmp_path_factory.mktemp("prefect-home")
    os.environ["PREFECT_HOME"] = str(home)
    # Offline machine: the server's telemetry only fails (and locks its SQLite).
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def prefect_api_url(prefect_api: None) -> str:
    """The session's Prefect API server, for ``vcdl`` subprocesses whose subject is
    not Prefect's temporary server: each process would otherwise start one of its
    own, ~18 s here with a fresh PREFECT_HOME, most of a small test run. The tests
    of the default path (the README's commands, the examples, the chaos run,
    SIGTERM) keep their own."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    assert url, "prefect_test_harness set no API URL"
    return str(url)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    # Under ``pytest -n 2``, a test marked ``alone`` has the machine to itself
    # (tests/lanes.py); without xdist this holds nothing.
    with lane(item):
        yield


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")
    parser.addoption(
        "--runlong", action="store_true", help="also run tests marked long (implies --runslow)"
    )


def _unit_first(item: pytest.Item) -> bool:
    return Path(item.path).parent.name != "unit"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The pure unit tests first (a stable sort keeps every other order): they
    # fail fastest, and they do not run beside the threads that the Prefect and
    # Dask integration tests leave in this process (a console test that times
    # threads failed once in CI that way, after the integration tests).
    items.sort(key=_unit_first)
    # The acceptance runs of several minutes each (docs/testing.md, "long"):
    # only when asked, CI included, which keeps CI within its time.
    run_long = config.getoption("--runlong") or os.environ.get("VCDL_LONG", "") == "1"
    if not run_long:
        skip_long = pytest.mark.skip(reason="long: run with --runlong or VCDL_LONG=1")
        for item in items:
            if "long" in item.keywords:
                item.add_marker(skip_long)
    # CI runs the slow tests; a laptop runs the fast suite unless asked.
    if run_long or config.getoption("--runslow") or os.environ.get("CI", "").lower() == "true":
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow (CI runs it)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
