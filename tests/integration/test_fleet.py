"""Acceptance ("Beyond one machine"): a run on a fleet of separate processes, as on real nodes.

Everything is a separate process talking over the network, the way
docs/spot-fleet.md sets a fleet up, all on loopback:

* a PostgreSQL ledger (a fresh schema, the ``pg_url`` fixture),
* an S3 weight store (moto, the ``s3_endpoint`` fixture),
* ``prefect server start`` (its own PREFECT_HOME),
* ``dask scheduler`` and two ``dask worker --resources GPU=1`` processes
  whose environment carries PREFECT_API_URL and the S3 credentials,
* the driver, ``python -m vcdl.cli train cfg.toml``, reporting to the server.

Mid-run one worker is SIGKILLed (its whole process group: nanny and worker,
as when a spot machine is taken back) and a fresh one joins. The run must
finish; ``vcdl audit`` must be clean; the head version must be readable with
plain zarr from S3 and equal vcdl's own reading; the Prefect server must hold
the completed ``vcdl-train`` / ``vcdl-epoch`` flow runs and the shard task
runs the workers reported; no worker may have started its own Prefect server.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest

from benchmarks.cli_proc import kill_group
from tests import prefecthome
from tests.ports import free_port
from tests.procenv import clean_env
from tests.s3fixture import S3_KEY, S3_SECRET, make_bucket

# Under `pytest -n 2` this runs with no other test beside it (tests/lanes.py):
# what it asserts depends on timing.
pytestmark = pytest.mark.alone

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "mnist1d.toml"
BIN = Path(sys.executable).parent
RUN = "fleet"
EPOCHS = 3
TEMP_SERVER = "temporary server"  # Prefect logs "Starting temporary server on ..."

PASSWORD = "s3cr3t-Pa55"  # a password no output may ever show


# As on a real GPU node (docs/spot-fleet.md): one single-threaded worker with one GPU.
WORKER_OPTIONS = ("--nworkers", "1", "--nthreads", "1", "--resources", "GPU=1", "--no-dashboard")


def _listen(port: int) -> tuple[str, ...]:
    return ("--host", "127.0.0.1", "--port", str(port))


def _named(name: str, tmp_path: Path) -> tuple[str, ...]:
    """A worker's name and its own scratch directory (not the shared /tmp one)."""
    return ("--name", name, "--local-directory", str(tmp_path / f"dask-{name}"))


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited {proc.returncode}:\n{_tail(log)}"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    pytest.fail(f"nothing listening on 127.0.0.1:{port} after {timeout:.0f}s:\n{_tail(log)}")


def _wait_health(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"prefect server exited {proc.returncode}:\n{_tail(log)}"
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{url}/health not healthy after {timeout:.0f}s:\n{_tail(log)}")


def _tail(log: Path, chars: int = 4000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"


class Fleet:
    """The test's processes, each in its own session so a kill takes its children too."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    def spawn(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115  (closed in stop())
        self._logs.append(log)
        proc = subprocess.Popen(
            args,
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> Path:
        return self.root / f"{name}.log"

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> None:
        kill_group(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            self.kill(proc)
        for log in self._logs:
            log.close()


def _base_env() -> dict[str, str]:
    """The test's environment without any Prefect or vcdl setting leaking in."""
    return clean_env(
        AWS_ACCESS_KEY_ID=S3_KEY,
        AWS_SECRET_ACCESS_KEY=S3_SECRET,
        MKL_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
    )


@pytest.fixture
def fleet(pg_url: str, s3_endpoint: str, tmp_path: Path) -> Iterator[Fleet]:
    """Processes of one test, all killed at teardown (before the schema is dropped)."""
    f = Fleet(tmp_path)
    try:
        yield f
    finally:
        f.stop()


def _toml_value(value: Any) -> str:
    return json.dumps(value)  # a JSON string or number is a valid TOML one


def _write_config(
    path: Path, scheduler: str, ledger_url: str, store_url: str, endpoint: str
) -> None:
    """examples/mnist1d.toml with the fleet's locations (no credentials in it)."""
    import tomllib

    base = tomllib.loads(EXAMPLE.read_text())
    assert "cluster" in base and "ledger" not in base and "store" not in base
    lines = []
    for section, values in base.items():
        if section == "cluster":
            continue
        lines.append(f"[{section}]")
        for key, value in values.items():
            if section == "run" and key == "name":
                value = RUN
            if section == "run" and key == "epochs":
                value = EPOCHS
            if isinstance(value, dict):
                inner = ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items())
                lines.append(f"{key} = {{ {inner} }}")
            else:
                lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    lines += [
        "[cluster]",
        f"address = {_toml_value(scheduler)}",
        "task_resources = { GPU = 1 }",
        "",
        "[ledger]",
        f"url = {_toml_value(ledger_url)}",
        "",
        "[store]",
        f"url = {_toml_value(store_url)}",
        f"storage_options = {{ endpoint_url = {_toml_value(endpoint)} }}",
        "",
    ]
    path.write_text("\n".join(lines))


def _with_password(url: str) -> str:
    """``url`` with PASSWORD as its password (the test server's trust auth ignores it)."""
    parts = urlsplit(url)
    assert parts.username and not parts.password, url
    netloc = f"{parts.username}:{PASSWORD}@{parts.hostname}:{parts.port}"
    return parts._replace(netloc=netloc).geturl()


def _worker_address(log: Path, timeout: float = 120) -> str:
    """The address a ``dask worker`` process logged ("Start worker at: tcp://...")."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(r"Start worker at:\s+(tcp://\S+)", log.read_text(errors="replace"))
        if match:
            return match.group(1)
        time.sleep(0.2)
    pytest.fail(f"no worker address in {log.name}:\n{_tail(log)}")


def _running_on(ledger: Any, worker: str) -> str | None:
    """Id of an attempt after epoch 0 running on ``worker``, if any."""
    try:
        attempts = ledger.attempts(RUN)
    except Exception:
        return None
    running = (a for a in attempts if a.epoch >= 1 and a.state == "running")
    return next((a.id for a in running if a.worker == worker), None)


def _rows_in_schema(url: str) -> int:
    """Attempt rows of RUN in the schema named by ``url``'s search_path option."""
    import psycopg

    query = parse_qs(urlsplit(url).query)
    schema = query["options"][0].removeprefix("-csearch_path=")
    parts = urlsplit(url)
    with psycopg.connect(
        host=parts.hostname, port=parts.port, user=parts.username, dbname=parts.path.lstrip("/")
    ) as conn:
        row = conn.execute(
            f'SELECT count(*) FROM "{schema}".attempt WHERE run = %s', (RUN,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _merged(ledger: Any, epoch: int) -> int:
    try:
        return sum(1 for s in ledger.subtasks(RUN, epoch) if s.state == "merged")
    except Exception:  # the run or its tables are not there yet
        return 0


def _prefect_runs(api_url: str) -> tuple[dict[str, list[Any]], list[Any]]:
    """Flow runs by flow name and every task run, from the fleet's Prefect server."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        assert str(client.api_url).rstrip("/") == api_url
        flows: dict[str, list[Any]] = {}
        for name in ("vcdl-train", "vcdl-epoch"):
            flows[name] = client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=[name])), limit=200
            )
        tasks = client.read_task_runs(limit=200)
    return flows, tasks


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.s3
@pytest.mark.timeout(900)
def test_fleet_run_survives_a_lost_worker(
    pg_url: str, s3_endpoint: str, fleet: Fleet, tmp_path: Path
) -> None:
    import zarr

    from vcdl.ledger import Ledger
    from vcdl.store import WeightStore

    env = _base_env()
    started = time.monotonic()

    # -- Prefect server, its own home --------------------------------------------
    prefect_port = free_port()
    api_url = f"http://127.0.0.1:{prefect_port}/api"
    server_env = dict(env, PREFECT_HOME=str(prefecthome.seed(tmp_path / "prefect-server")))
    server = fleet.spawn(
        "prefect-server",
        [str(BIN / "prefect"), "server", "start", *_listen(prefect_port), "--no-ui"],
        server_env,
    )

    # -- Dask scheduler and two GPU workers (started meanwhile) -------------------
    sched_port = free_port()
    scheduler = f"tcp://127.0.0.1:{sched_port}"
    sched = fleet.spawn(
        "scheduler",
        [str(BIN / "dask"), "scheduler", *_listen(sched_port), "--no-dashboard"],
        env,
    )
    _wait_port(sched_port, sched, fleet.log("scheduler"), 60)

    def start_worker(name: str) -> subprocess.Popen[bytes]:
        worker_env = dict(
            env,
            PREFECT_API_URL=api_url,
            # Its own home: a temporary server it might start would leave a database here.
            PREFECT_HOME=str(tmp_path / f"prefect-{name}"),
        )
        return fleet.spawn(
            name,
            [str(BIN / "dask"), "worker", scheduler, *WORKER_OPTIONS, *_named(name, tmp_path)],
            worker_env,
        )

    workers = {name: start_worker(name) for name in ("worker-a", "worker-b")}
    _wait_health(api_url, server, fleet.log("prefect-server"), 120)
    victim = _worker_address(fleet.log("worker-a"))
    print(f"fleet up in {time.monotonic() - started:.1f}s: prefect {api_url}, dask {scheduler}")

    # -- the driver ----------------------------------------------------------------
    bucket = make_bucket(s3_endpoint)
    store_url = f"s3://{bucket}/vcdl"
    cfg_path = tmp_path / "fleet.toml"
    _write_config(cfg_path, scheduler, pg_url, store_url, s3_endpoint)
    assert S3_SECRET not in cfg_path.read_text()  # credentials come from the environment
    home = tmp_path / "home"
    driver_env = dict(env, PREFECT_API_URL=api_url, PREFECT_HOME=str(tmp_path / "prefect-driver"))
    driver = fleet.spawn(
        "driver",
        [sys.executable, "-m", "vcdl.cli", "train", str(cfg_path), "--home", str(home), "--json"],
        driver_env,
    )

    # -- lose a worker mid-run, a fresh one joins ------------------------------------
    ledger = Ledger(pg_url)
    try:
        # Once epoch 1 has merged something, kill a worker while the ledger
        # shows it running an attempt: that attempt must be lost and redone.
        # An attempt can finish between the poll and the kill landing; then the
        # kill lost nothing, and the next worker is tried the same way.
        targets = ("worker-a", "worker-b", "worker-c")
        joined: list[str] = []  # addresses of the replacement workers
        lost, victim = None, ""
        for round_, target in enumerate(targets):
            victim = _worker_address(fleet.log(target))
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                assert driver.poll() is None, f"driver exited early:\n{_tail(fleet.log('driver'))}"
                lost = _running_on(ledger, victim) if _merged(ledger, 1) >= 1 else None
                if lost is not None:
                    break
                time.sleep(0.1)
            else:
                pytest.fail(f"{target} ran nothing after epoch 0:\n{_tail(fleet.log('driver'))}")
            assert lost is not None
            fleet.kill(workers[target])  # nanny and worker: the machine is gone
            state = ledger.get_attempt(lost).state
            print(
                f"SIGKILLed {target} at {time.monotonic() - started:.1f}s with attempt {lost} "
                f"{state} (epoch 1: {_merged(ledger, 1)} merged)"
            )
            fresh = f"worker-{chr(ord('c') + round_)}"
            workers[fresh] = start_worker(fresh)
            joined.append(_worker_address(fleet.log(fresh)))
            if state in ("running", "killed"):  # it died with the worker
                break
        else:
            pytest.fail("every attempt finished before its worker's kill landed")

        try:
            driver.wait(600)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the driver did not finish:\n{_tail(fleet.log('driver'))}")
        out = _tail(fleet.log("driver"), 6000)
        print(out[-2500:])
        assert driver.returncode == 0, out
        print(f"run finished at {time.monotonic() - started:.1f}s")

        # The lost attempt is recorded as killed, its shard merged from another
        # attempt, and the worker that joined mid-run got work.
        attempts = ledger.attempts(RUN)
        lost_attempt = next(a for a in attempts if a.id == lost)
        assert lost_attempt.state == "killed", lost_attempt
        key = (lost_attempt.epoch, lost_attempt.shard)
        redone = [a for a in attempts if (a.epoch, a.shard) == key and a.id != lost]
        merged = [a for a in redone if a.state == "merged"]
        assert len(merged) == 1 and merged[0].worker != victim, redone
        assert any(a.worker in joined and a.state == "merged" for a in attempts), [
            (a.epoch, a.shard, a.worker, a.state) for a in attempts
        ]

        # -- the ledger: audit and status through the CLI ----------------------------
        # With a password in the ledger URL (the test server's trust auth
        # ignores it): the CLI must never show it.
        cli_env = dict(env, PREFECT_HOME=str(tmp_path / "prefect-cli"))
        secret_url = _with_password(pg_url)

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "vcdl.cli",
                    *args,
                    "--ledger",
                    secret_url,
                    "--home",
                    str(home),
                ],
                env=cli_env,
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert PASSWORD not in proc.stdout + proc.stderr, (args, proc.stdout, proc.stderr)
            return proc

        audit = cli("audit", RUN, "--deep")
        assert audit.returncode == 0, audit.stdout + audit.stderr
        assert "audit of fleet: ok" in audit.stdout
        status_proc = cli("status", RUN, "--json")
        assert status_proc.returncode == 0, status_proc.stderr
        status = json.loads(status_proc.stdout)
        print(
            "status:",
            {k: status.get(k) for k in ("state", "epochs_completed", "head_version", "attempts")},
            {k: status.get(k) for k in ("kills", "reissues", "duplicates", "test_accuracy")},
        )
        assert status["state"] == "completed"
        assert status["epochs_completed"] == EPOCHS
        assert len(status["history"]) == EPOCHS
        assert all(h["merged"] == h["subtasks"] for h in status["history"]), status["history"]
        assert status["kills"] >= 1
        for args in (("status", RUN), ("runs",), ("status", "no-such-run")):
            cli(*args)  # the text outputs and the error path: no password either

        # -- the head from S3, with plain zarr ---------------------------------------
        head = ledger.head(RUN)
        assert head.number == status["head_version"]
        options = {"endpoint_url": s3_endpoint, "key": S3_KEY, "secret": S3_SECRET}
        group = zarr.open_group(f"{store_url}/{head.uri}", mode="r", storage_options=options)
        # vcdl's record: tensor name -> its dtype's flat array, offset, shape
        # (store format 2, vcdl/store/layout.py).
        meta: Any = group.attrs["vcdl"]
        records: dict[str, Any] = meta["tensors"]
        arrays = dict(group.arrays())
        assert sorted(arrays) == sorted({r["array"] for r in records.values()})
        ours = WeightStore(store_url, {"endpoint_url": s3_endpoint}).read_state(head.uri)
        assert list(ours) == list(records)
        for name, record in records.items():
            start, numel = record["offset"], int(np.prod(record["shape"], dtype=np.int64))
            flat = arrays[record["array"]][start : start + numel]
            plain = np.asarray(flat).reshape(record["shape"])
            assert list(plain.shape) == list(record["shape"]) == list(ours[name].shape), name
            assert plain.dtype == ours[name].numpy().dtype, name
            np.testing.assert_array_equal(plain, ours[name].numpy(), err_msg=name)
        print(f"head v{head.number}: {len(arrays)} arrays read with plain zarr from {store_url}")

        # The schema in the URL's options reached every process: all of the
        # run's rows are in the test's schema (read here without the option).
        assert _rows_in_schema(pg_url) == len(attempts), len(attempts)
    finally:
        ledger.close()

    # -- the Prefect server saw it all; nobody started a server of their own ---------
    flows, tasks = _prefect_runs(api_url)
    train_runs, epoch_runs = flows["vcdl-train"], flows["vcdl-epoch"]
    assert len(train_runs) == 1 and train_runs[0].state_type.value == "COMPLETED", train_runs
    assert len(epoch_runs) == EPOCHS, [r.name for r in epoch_runs]
    # One subflow object for all epochs: the run name comes from its template.
    assert sorted(r.name for r in epoch_runs) == [f"{RUN} · epoch {e}" for e in range(EPOCHS)]
    assert all(r.parent_task_run_id is not None for r in epoch_runs), "subflows of the train run"
    assert all(r.state_type.value == "COMPLETED" for r in epoch_runs), [
        (r.name, r.state_type) for r in epoch_runs
    ]
    shard_runs = [t for t in tasks if t.name.startswith("epoch ")]
    completed_shards = [t for t in shard_runs if t.state_type.value == "COMPLETED"]
    shards = int(status["history"][0]["subtasks"])
    # Each shard task ran on a worker and reported there: the workers used our server.
    assert len(completed_shards) >= EPOCHS * shards, len(completed_shards)
    # Untagged: a tagged task run asks the server for tag concurrency slots
    # before it starts (one more round trip per attempt, seconds under load).
    assert not [t.tags for t in shard_runs if t.tags], [t.tags for t in shard_runs]
    for name in ("driver", *workers):
        text = fleet.log(name).read_text(errors="replace")
        if name == "driver":  # `vcdl train` writes Prefect's lines to the run's log file
            text += (home / "logs" / f"{RUN}.log").read_text(errors="replace")
        assert TEMP_SERVER not in text.lower(), f"{name} started a Prefect server:\n{text[-3000:]}"
        # A temporary server would have created its SQLite database in the home.
        prefect_home = tmp_path / f"prefect-{name}"
        assert not list(prefect_home.rglob("*.db")), (name, list(prefect_home.rglob("*")))
    host = urlsplit(api_url).netloc
    print(
        f"prefect {host}: 1 train, {len(epoch_runs)} epoch flow runs, "
        f"{len(completed_shards)}/{len(shard_runs)} shard task runs completed; "
        f"total {time.monotonic() - started:.1f}s"
    )


# -- the ledger password never shows ------------------------------------------------------


def _cli_output(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from vcdl.cli import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    out = capsys.readouterr()
    return int(info.value.code or 0), out.out + out.err


@pytest.mark.parametrize(
    "argv", [["status", "fleet"], ["status", "fleet", "--json"], ["runs"], ["audit", "fleet"]]
)
def test_unreachable_ledger_error_hides_the_password(
    argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Nothing listens on a port just freed: the connection fails at once.
    url = f"postgresql+psycopg://vcdl:{PASSWORD}@127.0.0.1:{free_port()}/vcdl"
    code, text = _cli_output([*argv, "--ledger", url, "--home", str(tmp_path)], capsys)
    assert code != 0
    assert PASSWORD not in text, text
    assert "vcdl:***@127.0.0.1" in text, text  # the URL is named, its password hidden


@pytest.mark.postgres
@pytest.mark.parametrize("argv", [["status", "no-such-run"], ["audit", "no-such-run"], ["runs"]])
def test_ledger_password_never_printed(
    argv: list[str], pg_url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The test server's trust auth ignores the password: the ledger opens and
    # the CLI prints its normal output or its "no run" error.
    url = _with_password(pg_url)
    code, text = _cli_output([*argv, "--ledger", url, "--home", str(tmp_path)], capsys)
    assert code == (0 if argv == ["runs"] else 2), text
    assert PASSWORD not in text, text
    if code:
        assert ":***@127.0.0.1" in text, text
