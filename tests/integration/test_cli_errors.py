"""Bad input gives one line naming the problem, exit code 2, and no ledger rows."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ports import free_port
from vcdl.cli import main
from vcdl.ledger import Ledger

# Under `pytest -n 2` this runs with no other test beside it (tests/lanes.py):
# what it asserts depends on timing.
pytestmark = pytest.mark.alone

GOOD = """
[run]
epochs = 1
[data]
name = "digits"
shards = 2
[model]
factory = "cnn2d"
"""


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    return int(info.value.code or 0), err


def _no_runs(home: Path) -> bool:
    db = home / "ledger.db"
    if not db.exists():
        return True
    import sqlite3

    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("select name from sqlite_master where type='table'")}
        return "run" not in tables or conn.execute("select count(*) from run").fetchone()[0] == 0


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (GOOD + "bogus = 1\n", "model.bogus: unknown key"),
        (
            GOOD.replace("epochs = 1", "epochs = 'one'"),
            "run.epochs: must be a number, not a string or true/false (got 'one')",
        ),
        (GOOD.replace('name = "digits"', 'name = "nosuch"'), "data set 'nosuch' not found"),
        (GOOD.replace('"cnn2d"', '"nosuch_pkg.models:net"'), "nosuch_pkg"),
        (GOOD + "[merge]\nalpha = 1.5\n", "merge.alpha"),
        (GOOD.replace("shards = 2", "shards = 0"), "data.shards"),
        (GOOD.replace("shards = 2", "shards = 5000"), "data.shards is 5000 but data set"),
        (
            GOOD + "[train]\nbatch_size = 800\n",
            "train.batch_size is 800 but the 2 shard(s) of data set 'digits' hold 718 training "
            "rows each (1437 rows / 2): every step would train on a whole shard, not a batch of "
            "800; set train.batch_size to at most 718 or data.shards to at most 1",
        ),
        (GOOD + "[ledger]\nurl = 'mysql://h/db'\n", "ledger.url: must be sqlite"),
        (GOOD + "[store]\nurl = 'foo://bucket/x'\n", "cannot open store"),
        (GOOD + "[store]\nurl = 's3://'\n", "store url 's3://' names nothing after s3://"),
        (GOOD + "[fault]\nattempt_timeout = inf\n", "fault.attempt_timeout"),
        (GOOD + "[train]\nweight_decay = 1e30\n", "train.weight_decay"),
        (
            GOOD.replace('name = "digits"', 'name = "mnist1d"\nsamples = 1000000000000'),
            "data.samples",
        ),
        ("[run\nepochs=", "not valid TOML"),
        (GOOD + "[cost]\ninstance_type = 'h100'\n", "no price for instance type 'h100'"),
    ],
    ids=[
        "unknown-key",
        "wrong-type",
        "missing-data",
        "unknown-model",
        "alpha",
        "zero-shards",
        "more-shards-than-rows",
        "batch-larger-than-a-shard",
        "unsupported-ledger",
        "unsupported-store",
        "store-without-bucket",
        "infinite-timeout",
        "huge-weight-decay",
        "huge-samples",
        "toml",
        "unpriced-instance",
    ],
)
def test_bad_input_exit_2(
    body: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(body)
    home = tmp_path / "home"
    code, err = _run(["train", str(cfg), "--home", str(home)], capsys)
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("vcdl: error: ") and needle in lines[0], lines[0]
    assert _no_runs(home)


def test_a_batch_larger_than_a_shard_is_refused_on_the_flow_path_too(tmp_path: Path) -> None:
    """A form's config reaches prepare_run without the CLI's preflight: same check there."""
    from vcdl.config import parse_config
    from vcdl.driver.runs import prepare_run
    from vcdl.errors import ConfigError

    cfg = parse_config(
        {"run": {"name": "big-batch"}, "data": {"name": "digits", "shards": 4}}
    ).updated(train={"batch_size": 400})
    cfg = cfg.with_locations(tmp_path / "home")
    with pytest.raises(ConfigError, match=r"train.batch_size is 400 .* at most 359 or data.shards"):
        prepare_run(cfg)
    assert _no_runs(tmp_path / "home")


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(["train", str(tmp_path / "nope.toml"), "--home", str(tmp_path)], capsys)
    assert code == 2 and "not found" in err


def test_unknown_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Ledger(f"sqlite:///{tmp_path / 'ledger.db'}").close()  # a ledger without that run
    code, err = _run(["status", "ghost", "--home", str(tmp_path)], capsys)
    assert code == 2 and "no run 'ghost'" in err


@pytest.mark.parametrize("command", ["status", "cost", "audit", "resume"])
def test_reading_a_home_without_a_ledger_creates_none(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A mistyped --home is named as such, not answered from a new empty ledger.
    home = tmp_path / "typo"
    code, err = _run([command, "ghost", "--home", str(home)], capsys)
    assert code == 2, err
    assert f"no ledger file {home / 'ledger.db'}" in err and "--home" in err, err
    assert not home.exists()


@pytest.mark.parametrize("command", ["runs", "status", "cost", "audit"])
def test_reading_an_empty_ledger_file_leaves_it_empty(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "ledger.db").touch()
    argv = [command] if command == "runs" else [command, "somerun"]
    code, err = _run([*argv, "--home", str(home)], capsys)
    assert code in (0, 2), err
    assert len([line for line in err.splitlines() if line.strip()]) <= 1, err
    assert (home / "ledger.db").stat().st_size == 0
    assert sorted(p.name for p in home.iterdir()) == ["ledger.db"]


def test_runs_in_a_fresh_home(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["runs", "--home", str(tmp_path / "fresh")])
    assert (info.value.code or 0) == 0
    assert capsys.readouterr().out.startswith("no runs yet")
    assert not (tmp_path / "fresh").exists()


def test_bad_set_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(GOOD)
    code, err = _run(["train", str(cfg), "--home", str(tmp_path), "--set", "lr=1"], capsys)
    assert code == 2 and "section.key=value" in err


def test_a_closed_output_pipe_ends_quietly(tmp_path: Path) -> None:
    """`vcdl ... | head -1`: the reader leaves first; no BrokenPipeError traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "vcdl.cli", "runs", "--home", str(tmp_path / "fresh")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command writes anything: its write hits EPIPE
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.parametrize(
    ("make", "args", "needle"),
    [
        (lambda p: p.write_bytes(b"tiny"), [], "make no rows"),
        (lambda p: p.write_bytes(b"x" * 4000), ["--context", "0"], "context must be >= 1"),
        (lambda p: p.write_bytes(b"not parquet"), ["--format", "table"], "not a readable"),
        (lambda p: p.write_bytes(b"PK not a zip"), ["--format", "npz"], "cannot import"),
        (lambda p: None, [], "no such file"),
    ],
    ids=["short-text", "bad-context", "junk-table", "junk-npz", "missing"],
)
def test_bad_imports_exit_2_and_write_nothing(
    make: object, args: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "input.bin"
    make(src)  # type: ignore[operator]
    home = tmp_path / "home"
    code, err = _run(
        ["data", "import", str(src), "--name", "x", "--home", str(home), *args], capsys
    )
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("vcdl: error: "), err
    assert needle in lines[0], lines[0]
    assert not (home / "store" / "datasets" / "x").exists()


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--preempt-notices", "2", "--preempt-notices must be a fraction"),
        ("--preempt", "nan", "--preempt must be events per second"),
        ("--preempt-grace", "-1", "--preempt-grace must be seconds"),
        ("--preempt-start", "inf", "--preempt-start must be seconds"),
    ],
)
def test_preemption_options_out_of_range_fail_before_the_run(
    flag: str, value: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "good.toml"
    cfg.write_text(GOOD)
    home = tmp_path / "home"
    code, err = _run(["train", str(cfg), "--home", str(home), flag, value], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and needle in lines[0], err
    assert not home.exists()


@pytest.mark.parametrize(
    ("address", "needle"),
    [
        ("notanaddress", "bad scheduler address"),
        ("tcp://127.0.0.1", "bad scheduler address"),
        ("http://127.0.0.1:8786", "bad scheduler address"),
        (f"tcp://127.0.0.1:{free_port()}", "no Dask scheduler answered"),
    ],
    ids=["no-scheme", "no-port", "http", "nobody-there"],
)
def test_chaos_against_a_bad_or_silent_address_fails_fast_in_one_line(
    address: str, needle: str, tmp_path: Path
) -> None:
    import time

    log = tmp_path / "events.jsonl"
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vcdl.cli",
            "chaos",
            address,
            "--rate",
            "1",
            "--duration",
            "5",
            "--log",
            str(log),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - started < 35
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr
    assert not log.exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--rate", "1", "--duration", "inf"], "--duration must be seconds"),
        (["--rate", "1e9", "--duration", "5"], "--rate must be events per second from 0 to 100"),
        (["--rate", "-1", "--duration", "5"], "--rate must be events per second"),
    ],
    ids=["infinite-duration", "huge-rate", "negative-rate"],
)
def test_chaos_options_out_of_range(
    args: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "events.jsonl"
    code, err = _run(["chaos", "tcp://127.0.0.1:8786", *args, "--log", str(log)], capsys)
    assert code == 2 and needle in err and len(err.splitlines()) == 1, err
    assert not log.exists()


def test_a_huge_preemption_rate_is_refused_by_the_cli_and_the_api(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from vcdl import api
    from vcdl.config import parse_config
    from vcdl.errors import ConfigError

    cfg = tmp_path / "good.toml"
    cfg.write_text(GOOD)
    home = tmp_path / "home"
    code, err = _run(["train", str(cfg), "--home", str(home), "--preempt", "1e9"], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "--preempt must be events per second" in err, err
    assert not home.exists()
    # The Python API: the same bound, one ConfigError line (exit 2), nothing prepared.
    with pytest.raises(ConfigError, match=r"invalid chaos: rate: .*less than or equal to 100") as e:
        api.run(parse_config({"run": {"name": "x"}}), home=home, chaos={"rate": 1e9})
    assert "\n" not in str(e.value)
    assert not (home / "ledger.db").exists()


def test_a_taken_metrics_port_fails_the_cli_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[run]\nepochs = 1\n[data]\nname = "digits"\nshards = 2\n')
    home = tmp_path / "home"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for argv in (
            ["train", str(config), "--home", str(home), "--metrics-port", str(port)],
            ["train", str(config), "--home", str(home), "--metrics-port", "70000"],
        ):
            with pytest.raises(SystemExit) as info:
                main(argv)
            err = capsys.readouterr().err
            lines = [line for line in err.splitlines() if line.strip()]
            assert info.value.code == 2 and len(lines) == 1, err
            assert lines[0].startswith("vcdl: error: ") and "metrics.port" in lines[0], err
    assert not home.exists()


@pytest.mark.parametrize("command", ["train", "resume"])
def test_a_cluster_address_nobody_listens_at_is_one_line_before_the_run_starts(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistyped port, or a scheduler not up yet: before, the flow waited out its 60-s
    connect timeout and ended in a traceback, leaving a failed run in the ledger."""
    import time

    cfg = tmp_path / "good.toml"
    cfg.write_text(GOOD)
    home = tmp_path / "home"
    address = f"tcp://127.0.0.1:{free_port()}"
    if command == "resume":
        # A run recorded on a scheduler that is gone by the time it is resumed.
        from vcdl import api
        from vcdl.config_files import load_config
        from vcdl.driver.runs import prepare_run

        sets = ["run.name=gone", f"cluster.address={address}"]
        prepare_run(api.resolve(load_config(cfg, sets), home=home))
        argv = ["resume", "gone", "--home", str(home)]
    else:
        argv = ["train", str(cfg), "--home", str(home), "--set", f"cluster.address={address}"]
    started = time.monotonic()
    code, err = _run(argv, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert f"no Dask scheduler answered at {address} (connection refused)" in lines[0]
    assert time.monotonic() - started < 10
    if command == "train":
        assert _no_runs(home)


def test_a_run_started_without_the_cli_says_the_same_at_once(
    prefect_api: None, tmp_path: Path
) -> None:
    """A deployment or an API call skips the CLI's check: the flow asks before its first
    client, and fails with the same sentence instead of Dask's 60-s timeout."""
    import time

    from vcdl import api
    from vcdl.config_files import load_config
    from vcdl.errors import ClusterUnreachable

    cfg = tmp_path / "good.toml"
    cfg.write_text(GOOD)
    address = f"tcp://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ClusterUnreachable, match=r"\(connection refused\); is `dask scheduler`"):
        api.train(load_config(cfg, ["run.name=api", f"cluster.address={address}"]), home=tmp_path)
    assert time.monotonic() - started < 30


@pytest.mark.slow
def test_a_second_driver_of_a_running_run_is_refused_before_it_starts_anything(
    prefect_api_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: the second `vcdl train` started Prefect and a cluster, printed progress for
    16 s, then failed with exit 1 (LeaseHeld); it appended to the run's log too."""
    import time

    from benchmarks.cli_proc import log_tail, reap, start_vcdl
    from tests.driverwait import wait_for_run

    cfg = tmp_path / "busy.toml"
    cfg.write_text(
        GOOD.replace("epochs = 1", "epochs = 200").replace("[run]", "[run]\nname = 'busy'")
    )
    home = tmp_path / "home"
    first = start_vcdl(home, "train", str(cfg), env={"PREFECT_API_URL": prefect_api_url})
    try:
        held = wait_for_run(
            first,
            home / "ledger.db",
            "busy",
            lambda run: run.state == "running" and run.lease_owner is not None,
            timeout=300,
            tail=lambda: log_tail(home, "train"),
        )
        log = home / "logs" / "busy.log"
        before = log.read_bytes()
        for argv in (["train", str(cfg)], ["resume", "busy"]):
            started = time.monotonic()
            code, err = _run([*argv, "--home", str(home)], capsys)
            took = time.monotonic() - started
            lines = [line for line in err.splitlines() if line.strip()]
            assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
            assert f"run 'busy' is being driven by process {first.pid} on " in lines[0], err
            assert "`vcdl resume busy`" in lines[0], err
            assert took < 15, took
            # Nothing started: no Prefect, no cluster, not a line in the run's log.
            assert "log in" not in err and log.read_bytes()[: len(before)] == before
            assert b"vcdl train busy" not in log.read_bytes()[len(before) :]
            assert b"vcdl resume busy" not in log.read_bytes()
        run = Ledger(f"sqlite:///{home / 'ledger.db'}").get_run("busy")
        assert run.lease_owner == held.lease_owner and run.state == "running"
        assert first.poll() is None, log_tail(home, "train")
    finally:
        reap(first)


def _random_bytes(db: Path) -> None:
    db.write_bytes(bytes(range(256)) * 16)


def _other_tables(db: Path) -> None:
    import sqlite3

    with sqlite3.connect(db) as conn:
        conn.execute("create table invoices (id integer primary key, total real)")


def _lost_version_table(db: Path) -> None:
    import sqlite3

    Ledger(f"sqlite:///{db}").close()
    with sqlite3.connect(db) as conn:
        conn.execute("drop table alembic_version")


def _tables(db: Path) -> list[str]:
    import sqlite3

    with sqlite3.connect(db) as conn:
        return sorted(
            r[0] for r in conn.execute("select name from sqlite_master where type='table'")
        )


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (_random_bytes, "the file is not an SQLite database (not a vcdl ledger); move it away"),
        (_other_tables, "is an SQLite database of other tables (invoices) without vcdl's"),
        (_lost_version_table, "no alembic_version table, and columns newer than the first"),
    ],
    ids=["not-a-database", "someone-elses-tables", "alembic-version-lost"],
)
@pytest.mark.parametrize("command", ["train", "status", "runs"])
def test_a_file_that_is_no_vcdl_ledger_is_refused_in_one_line(
    make: object, needle: str, command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: "duplicate column name: timings" (exit 1) for a ledger that lost its
    alembic_version table; another SQLite file had vcdl's tables added to it; a file that
    is no database said so without what to do."""
    home = tmp_path / "home"
    home.mkdir()
    db = home / "ledger.db"
    make(db)  # type: ignore[operator]
    tables = _tables(db) if make is not _random_bytes else None
    # Someone else's file is left byte for byte: not even switched to WAL (it was).
    before = db.read_bytes() if make is not _lost_version_table else None
    cfg = tmp_path / "good.toml"
    cfg.write_text(GOOD)
    argv = {"train": ["train", str(cfg)], "status": ["status", "x"], "runs": ["runs"]}[command]
    code, err = _run([*argv, "--home", str(home)], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0] and ("--home" in lines[0] or "backup" in lines[0]), err
    assert "duplicate column" not in err
    if before is not None:
        assert db.read_bytes() == before
        assert sorted(p.name for p in home.iterdir()) == ["ledger.db"]  # no -wal, no -shm
    if tables is not None:
        assert _tables(db) == tables
    if make is _other_tables:
        import sqlite3

        with sqlite3.connect(db) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert not (home / "logs").exists() and not (home / "prefect").exists()


@pytest.mark.postgres
@pytest.mark.parametrize("command", ["runs", "status"])
def test_a_postgres_database_of_other_tables_is_no_ledger(
    pg_url: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: vcdl's tables were added beside another application's in its schema."""
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(pg_url)
    schema = str(url.query["options"]).rpartition("=")[2]
    conninfo = {"host": url.host, "port": url.port, "dbname": url.database, "user": url.username}

    def tables() -> list[str]:
        with psycopg.connect(**conninfo) as conn:
            rows = conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                (schema,),
            ).fetchall()
        return sorted(r[0] for r in rows)

    with psycopg.connect(**conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{schema}".invoices (id integer primary key, total real)')
    argv = {"runs": ["runs"], "status": ["status", "x"]}[command]
    code, err = _run([*argv, "--ledger", pg_url], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "holds other tables (invoices) without vcdl's: not a vcdl ledger" in lines[0], err
    assert "CREATE DATABASE vcdl" in lines[0], err
    # The API refuses it too, and nothing was added by either.
    from vcdl.errors import NotALedger

    with pytest.raises(NotALedger):
        Ledger(pg_url)
    assert tables() == ["invoices"]
