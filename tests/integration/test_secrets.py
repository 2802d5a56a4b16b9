"""Issue 34's acceptance for secrets: a planted secret is in no output, row, artifact, event or log.

Three ways a secret meets vcdl:

- in the config (a nested ``store.storage_options`` credential, a password
  in the query of ``ledger.url`` or ``store.url``): refused in one line that
  does not hold it, nothing written (tests/integration/test_hostile_input.py,
  and here through a deployment's form);
- as a password in a PostgreSQL URL given on the command line (``--ledger``),
  which vcdl allows for reading runs: the command works, and neither its
  output nor its logs hold the password;
- as a credential in the environment (``AWS_SECRET_ACCESS_KEY`` for the S3
  store), the allowed way: a whole run trains on S3 with it, and then every
  output of the CLI, every table of the ledger, every object in the bucket,
  every file under the vcdl and Prefect homes (Prefect's database holds the
  flow runs' parameters, logs, artifacts and events) and what Prefect's API
  serves of them is searched for it.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import prefecthome
from vcdl.cli import main

SECRET = "Pl4nted-Secr3t-9f2c"
REPO = Path(__file__).resolve().parents[2]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    captured = capsys.readouterr()
    return int(info.value.code or 0), captured.out + captured.err


def _holding(root: Path, secret: str) -> list[str]:
    """Every file under ``root`` whose bytes hold ``secret`` (as text or UTF-16)."""
    needles = (secret.encode(), secret.encode("utf-16-le"))
    return [
        str(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and any(n in p.read_bytes() for n in needles)
    ]


def test_the_file_search_finds_a_planted_secret(tmp_path: Path) -> None:
    """The search below can fail: it finds the secret where it is."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "log").write_bytes(b"\x00binary " + SECRET.encode() + b" tail")
    assert _holding(tmp_path, SECRET) == [str(tmp_path / "a" / "b" / "log")]


def _sqlite_rows(db: Path) -> str:
    """Every row of every table of a SQLite file, as text."""
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        assert "run" in tables and "attempt" in tables, tables
        return "\n".join(
            repr(row) for t in tables for row in conn.execute(f'SELECT * FROM "{t}"').fetchall()
        )


# --------------------------------------------------------------------------
# A PostgreSQL password given on the command line
# --------------------------------------------------------------------------


def test_a_ledger_url_password_on_the_command_line_is_used_and_never_shown(
    pg_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Trust auth ignores the password, so the commands work and every output can be read."""
    from vcdl.ledger import Ledger

    Ledger(pg_url).close()  # vcdl's tables in the test's schema
    user = pg_url.split("://", 1)[1].split("@", 1)[0]
    with_password = pg_url.replace(f"://{user}@", f"://{user}:{SECRET}@", 1)
    closed = with_password.replace(":5432/", ":1/", 1)
    caplog.set_level(logging.DEBUG)
    home = tmp_path / "home"
    code, shown = _run(["runs", "--ledger", with_password, "--home", str(home)], capsys)
    assert code == 0 and "no runs yet" in shown, shown
    code, shown2 = _run(["status", "ghost", "--ledger", with_password], capsys)
    assert code == 2 and "no run 'ghost'" in shown2, shown2
    code, shown3 = _run(["status", "ghost", "--ledger", closed], capsys)
    lines = [line for line in shown3.splitlines() if line.strip()]
    assert code in (1, 2) and len(lines) == 1, shown3  # a ledger that cannot be reached
    everything = shown + shown2 + shown3 + "\n".join(r.getMessage() for r in caplog.records)
    assert SECRET not in everything
    assert not home.exists()


# --------------------------------------------------------------------------
# A form's ledger URL with a password
# --------------------------------------------------------------------------


def test_a_forms_ledger_url_with_a_password_is_refused_without_echoing_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import flows.guard
    from vcdl.errors import ConfigError

    monkeypatch.setattr(flows.guard, "from_deployment", lambda: True)
    monkeypatch.setenv("VCDL_HOME", str(tmp_path / "home"))
    for url in (
        f"postgresql+psycopg://vcdl:{SECRET}@127.0.0.1/db",
        f"postgresql+psycopg://vcdl@127.0.0.1/db?password={SECRET}",
        f"sqlite:///{tmp_path}/l.db?token={SECRET}",
    ):
        with pytest.raises(ConfigError) as info:
            flows.guard.form_ledger_url(url, None)
        assert "credentials" in str(info.value) and SECRET not in str(info.value)
    assert not (tmp_path / "home").exists()


def test_a_failure_event_shows_urls_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's failure event carries the error, whose URLs may hold a password."""
    import prefect.events

    from flows.reporting import emit

    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(prefect.events, "emit_event", lambda **kw: sent.append(kw))
    error = f"cannot open ledger postgresql+psycopg://u:{SECRET}@h/db?password={SECRET}&x=1"
    emit("vcdl.run.failed", "r", {"error": error, "epochs": 3})
    assert len(sent) == 1 and SECRET not in json.dumps(sent[0], default=str)
    assert sent[0]["payload"]["error"].startswith("cannot open ledger postgresql+psycopg://u:***@h")


# --------------------------------------------------------------------------
# A flow called from Python with a credential in its parameters
# --------------------------------------------------------------------------


def _prefect_db_files() -> list[Path]:
    """The session's Prefect database, with its write-ahead log."""
    from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL

    url = str(PREFECT_SERVER_DATABASE_CONNECTION_URL.value())
    db = Path(url.split(":///", 1)[1])
    assert db.exists(), url
    return [p for p in db.parent.iterdir() if p.name.startswith(db.name)]


def test_a_refused_flow_call_leaves_no_secret_in_prefect(
    prefect_api: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Prefect stores a called flow's parameters before the flow refuses them, and logs
    them when they fail validation: what it stores and logs has the credentials masked."""
    from prefect.exceptions import ParameterTypeError

    from flows.evaluate import evaluate
    from flows.train import train

    home = str(tmp_path / "home")
    # What Prefect's flows logger says, whichever stream its handlers write to.
    said: list[str] = []
    listen = logging.Handler()
    listen.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("prefect.flows").addHandler(listen)
    refused: list[Any] = [
        {"run": {"name": "sec-a"}, "store": {"storage_options": {"secret": SECRET}}},
        {"run": {"name": "sec-b"}, "ledger": {"url": f"postgresql+psycopg://u:{SECRET}@h/db"}},
        {"run": {"name": "sec-c"}, "store": {"url": f"s3://b/p?token={SECRET}"}},
    ]
    for config in refused:
        with pytest.raises(ParameterTypeError) as info:
            train(config=config, home=home)
        assert "credentials" in str(info.value) and SECRET not in str(info.value)
    # A trusted caller's ledger URL with a password is used as given (and fails
    # here: nothing listens), while Prefect stores it masked.
    with pytest.raises(Exception) as failed:  # whatever the driver raises
        evaluate(run="r", home=home, ledger_url=f"postgresql+psycopg://u:{SECRET}@127.0.0.1:9/d")
    assert SECRET not in str(failed.value)

    logging.getLogger("prefect.flows").removeHandler(listen)
    assert any(m.startswith("Parameter validation failed for flow 'vcdl-train'") for m in said)
    out = capfd.readouterr()
    assert SECRET not in out.out + out.err + "\n".join(said)
    files = _prefect_db_files()
    assert not [str(p) for p in files if SECRET.encode() in p.read_bytes()]
    # The masked parameters are there: the search looked where they are.
    assert any(b'"secret": "***"' in p.read_bytes() for p in files), files


# --------------------------------------------------------------------------
# A whole run with a credential in the environment
# --------------------------------------------------------------------------

READ_PREFECT = """
import json
from prefect.client.orchestration import get_client
from prefect.events.filters import EventFilter

with get_client(sync_client=True) as c:
    page = c.read_events(EventFilter(), limit=50)
    events = list(page.events)
    while page.next_page and len(events) < 2000:
        page = c.read_events_page(page.next_page)
        events += page.events
    out = {
        "flow_runs": [r.model_dump(mode="json") for r in c.read_flow_runs()],
        "artifacts": [a.model_dump(mode="json") for a in c.read_artifacts()],
        "logs": [x.model_dump(mode="json") for x in c.read_logs()],
        "events": [e.model_dump(mode="json") for e in events],
    }
print(json.dumps(out))
"""


@pytest.mark.slow
def test_a_credential_from_the_environment_leaks_nowhere_in_a_whole_run(
    s3_bucket_url: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    url, options = s3_bucket_url
    endpoint = options["endpoint_url"]
    cfg = tmp_path / "job.toml"
    cfg.write_text(
        "[run]\nepochs = 1\n[data]\nname = 'digits'\nshards = 2\n[model]\nfactory = 'cnn2d'\n"
        f"[cluster]\nworkers = 2\n[store]\nurl = '{url}'\n"
        f"[store.storage_options]\nendpoint_url = '{endpoint}'\n"
    )
    home, prefect_home = tmp_path / "home", prefecthome.seed(tmp_path / "prefect")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "AWS_"))}
    env |= {
        "PYTHONPATH": str(REPO),
        "PREFECT_HOME": str(prefect_home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # The allowed way: the AWS credential chain. moto takes any key.
        "AWS_ACCESS_KEY_ID": "planted-key-id",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "PGPASSWORD": SECRET,
    }

    def vcdl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "vcdl.cli", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
        )

    train = vcdl("train", str(cfg), "--home", str(home), "--json", "--verbose")
    assert train.returncode == 0, train.stderr[-3000:]
    summary = json.loads(train.stdout)
    assert summary["state"] == "completed" and summary["head_version"] == 2, summary
    outputs = [train]
    run = summary["run"]
    for args in (("status", run), ("audit", run)):
        done = vcdl(*args, "--home", str(home))
        assert done.returncode == 0, (args, done.stderr[-2000:])
        outputs.append(done)
    prefect = subprocess.run(
        [sys.executable, "-c", READ_PREFECT],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert prefect.returncode == 0, prefect.stderr[-3000:]
    served = json.loads(prefect.stdout)
    counts = {k: len(v) for k, v in served.items()}
    assert served["flow_runs"] and served["artifacts"] and served["logs"], counts
    assert served["events"], counts
    print(f"searched from Prefect's API: {counts}")

    # The run did use S3 (so the credential was used): its versions are in the bucket.
    import s3fs

    fs = s3fs.S3FileSystem(
        key="planted-key-id", secret=SECRET, client_kwargs={"endpoint_url": endpoint}
    )
    bucket = url.removeprefix("s3://").split("/", 1)[0]
    objects = [p for p in fs.find(bucket) if "/versions/" in p]
    assert objects, fs.find(bucket)[:20]
    in_bucket = [p for p in fs.find(bucket) if SECRET.encode() in fs.cat_file(p)]

    assert not [p.args for p in outputs if SECRET in p.stdout + p.stderr]
    assert SECRET not in _sqlite_rows(home / "ledger.db")
    assert SECRET not in prefect.stdout
    assert not in_bucket
    assert not _holding(home, SECRET)
    assert not _holding(prefect_home, SECRET)
