"""Prefect homes whose database is already migrated, for the Prefect servers the tests start.

A Prefect API server on a fresh ``PREFECT_HOME`` first creates its SQLite
database through every migration: measured here, a first flow run with its
temporary server took 19–23 s against 11–12 s on a home whose database was
already there. The tests start such servers in many places (a ``vcdl``
subprocess that runs without ``PREFECT_API_URL``, a ``prefect server
start``). :func:`seed` gives a home a copy of one database migrated once per
test process, so that each of them pays only its own start.

Not for the tests whose subject is a fresh machine (the README's commands,
the core install): they keep an empty home.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

__all__ = ["seed"]

_DB = "prefect.db"
_lock = threading.Lock()
_template: Path | None = None

# Runs Prefect's own start-up migration (what its server does on a new home).
_MIGRATE = (
    "import asyncio\n"
    "from prefect.server.database import provide_database_interface\n"
    "asyncio.run(provide_database_interface().create_db())\n"
)


def _build() -> Path:
    work = Path(tempfile.mkdtemp(prefix="vcdl-prefect-template-"))
    # Gone with the test process that made it: nothing of a test outlives the suite.
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    home = work / "home"
    env = dict(os.environ, PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    # The migration must write the home's own database, not a server's elsewhere.
    env.pop("PREFECT_API_DATABASE_CONNECTION_URL", None)
    out = subprocess.run(
        [sys.executable, "-c", _MIGRATE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if out.returncode != 0:
        raise RuntimeError(f"migrating a template Prefect database failed:\n{out.stderr[-3000:]}")
    # One self-contained file (the WAL folded in), safe to copy while nothing has it open.
    template = work / _DB
    con = sqlite3.connect(home / _DB)
    try:
        con.execute("VACUUM INTO ?", (str(template),))
    finally:
        con.close()
    shutil.rmtree(home, ignore_errors=True)
    return template


def seed(home: Path) -> Path:
    """Make ``home`` a Prefect home holding a migrated, empty database; returns ``home``.

    A home that already has a database is left as it is (a resumed run keeps its own).
    """
    global _template
    home.mkdir(parents=True, exist_ok=True)
    target = home / _DB
    if target.exists():
        return home
    with _lock:
        if _template is None or not _template.exists():
            _template = _build()
        shutil.copyfile(_template, target)
    return home
