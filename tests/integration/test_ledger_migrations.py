"""Schema migrations of the ledger (vcdl/migrations), on SQLite and PostgreSQL.

The migrations must build exactly the schema the models describe, a ledger
made before migrations existed must be adopted (stamped, not re-created), a
ledger at an older revision must be upgraded once however many processes
open it at once, and a ledger from a newer vcdl must be refused untouched.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, column, create_engine, insert, inspect, table, text
from sqlalchemy.engine import make_url
from sqlmodel import SQLModel

import vcdl.ledger.migrations as migrations
from vcdl.errors import LedgerError
from vcdl.ledger import Ledger, Run, utcnow
from vcdl.ledger.migrations import INITIAL_REVISION, LEDGER_TABLES, alembic_config, head_revision
from vcdl.ledger.migrations.__main__ import _next_rev_id, main


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    return url


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """A plain engine on the test database: no ledger, no migrations."""
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        Path(url.database or "").parent.mkdir(parents=True, exist_ok=True)
    plain = create_engine(url)
    yield plain
    plain.dispose()


def _differences(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, SQLModel.metadata))


def _revisions(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())


def test_migrations_build_exactly_the_models(engine: Engine) -> None:
    assert not inspect(engine).get_table_names()
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "head")
    assert _differences(engine) == []
    assert _revisions(engine) == [head_revision()]
    assert set(inspect(engine).get_table_names()) >= LEDGER_TABLES


def test_downgrade_to_nothing_and_up_again(engine: Engine) -> None:
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "head")
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "head")
    assert _differences(engine) == []


def test_pre_migration_ledger_is_stamped_not_recreated(engine: Engine, db_url: str) -> None:
    # What vcdl did before migrations: create_all of the models of that time
    # (revision 0001's schema, by definition), no alembic_version table.
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), INITIAL_REVISION)
        conn.execute(text("DROP TABLE alembic_version"))
    created = utcnow()
    # Only the columns of that time (today's model has more, with defaults).
    then = ("name", "config", "state", "head_version", "epochs_completed")
    then += ("created_at", "updated_at")
    run_0001 = table(
        "run", *(column(c.name, c.type) for c in Run.__table__.columns if c.name in then)
    )
    with engine.begin() as conn:
        conn.execute(
            insert(run_0001).values(
                name="old",
                config="{}",
                state="created",
                head_version=0,
                epochs_completed=0,
                created_at=created,
                updated_at=created,
            )
        )
    with Ledger(db_url) as ledger:
        run = ledger.get_run("old")
        assert (run.name, run.head_version) == ("old", 0)
        assert abs(run.created_at - created).total_seconds() < 1e-3
        ledger.ensure_subtasks("old", 0, 2)  # and it works as a ledger
    assert _revisions(engine) == [head_revision()]
    assert _differences(engine) == []


def test_reopen_at_head_runs_no_migration(
    engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A ledger at the initial revision, as a first vcdl with migrations left it.
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), INITIAL_REVISION)
    with Ledger(db_url) as ledger:
        ledger.create_run("a", "{}", "a/v0", "c0")
    assert _revisions(engine) == [head_revision()]

    calls: list[object] = []
    real_upgrade = migrations.upgrade

    def counted(*args: Any) -> str | None:
        calls.append(args)
        return real_upgrade(*args)

    monkeypatch.setattr(migrations, "upgrade", counted)
    for _ in range(2):
        with Ledger(db_url) as ledger:
            assert [r.name for r in ledger.list_runs()] == ["a"]
    assert calls == []  # at head: one read, no lock, no alembic
    assert _revisions(engine) == [head_revision()]


def test_partial_schema_is_refused(engine: Engine, db_url: str) -> None:
    SQLModel.metadata.tables["run"].create(engine)
    with pytest.raises(LedgerError, match=r"only some of the ledger's tables \(run\)"):
        Ledger(db_url)


def test_newer_schema_is_refused_untouched(engine: Engine, db_url: str) -> None:
    Ledger(db_url).close()
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(LedgerError, match=r"revision '9999'.*newer vcdl.*upgrade vcdl"):
        Ledger(db_url)
    assert _revisions(engine) == ["9999"]


def _open(url: str, barrier: Any, results: Any) -> None:
    try:
        barrier.wait(timeout=60)
        with Ledger(url) as ledger:
            ledger.list_runs()
        results.put("ok")
    except BaseException:
        results.put(traceback.format_exc())


@pytest.mark.slow
def test_processes_opening_a_new_ledger_at_once(db_url: str) -> None:
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_open, args=(db_url, barrier, results)) for _ in range(4)]
    for proc in procs:
        proc.start()
    try:
        outcomes = [results.get(timeout=90) for _ in procs]
    except queue.Empty:
        pytest.fail("a process did not open the ledger within 90 s")
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    assert outcomes == ["ok"] * 4, "\n".join(o for o in outcomes if o != "ok")
    with Ledger(db_url) as ledger, ledger._engine.connect() as conn:
        versions = conn.execute(text("SELECT version_num FROM alembic_version")).all()
    assert versions == [(head_revision(),)]


def test_migrations_helper(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check"]) == 0  # the models and the migrations agree
    assert main(["history"]) == 0
    assert f"-> {head_revision()} (head)" in capsys.readouterr().out
    assert _next_rev_id() == f"{int(head_revision()) + 1:04d}"


def test_migrations_helper_on_a_ledger(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["upgrade", "--url", db_url]) == 0
    assert main(["current", "--url", db_url]) == 0
    assert capsys.readouterr().out.strip().endswith(head_revision())
    assert main(["upgrade", "--url", db_url, "--sql"]) == 0
    assert "CREATE TABLE run" in capsys.readouterr().out


def test_quorum_deferred_subtasks_become_the_deferred_state(engine: Engine, db_url: str) -> None:
    """0005: a subtask a quorum left "pending" with the reason "deferred" is "deferred" now."""
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0004")
    Ledger(db_url).close()  # nothing to deferred yet: an empty ledger upgrades cleanly
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0004")
        conn.execute(
            text(
                "INSERT INTO run (name, config, state, head_version, epochs_completed, "
                "created_at, updated_at) VALUES ('r', '{}', 'running', 0, 1, :t, :t)"
            ),
            {"t": utcnow()},
        )
        for shard, (state, reason) in enumerate(
            [("pending", "deferred"), ("pending", None), ("merged", None), ("running", "deferred")]
        ):
            conn.execute(
                text(
                    "INSERT INTO subtask (run, epoch, shard, state, attempts, reason) "
                    "VALUES ('r', 0, :shard, :state, 0, :reason)"
                ),
                {"shard": shard, "state": state, "reason": reason},
            )
    with Ledger(db_url) as ledger:
        states = [(s.state, s.reason) for s in ledger.subtasks("r", 0)]
    # Only the quorum's own form moves; a deferred subtask already claimed again
    # ("running") is an open subtask of an earlier epoch, which the driver takes up.
    assert states == [
        ("deferred", "deferred"),
        ("pending", None),
        ("merged", None),
        ("running", "deferred"),
    ]
