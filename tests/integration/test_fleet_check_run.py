"""`vcdl fleet check` against real processes: a `dask scheduler`, two `dask worker`s, moto S3
and a PostgreSQL ledger, the way docs/spot-fleet.md sets a fleet up (all on loopback).

``worker-b`` is started without what the run's own module imports (``fleetdep``, on
``worker-a``'s and the driver's ``PYTHONPATH`` only, an "installed package" the
workers' image lacks). With a built-in model every worker can do the job: exit 0,
each worker's store probe (write, read, delete under ``fleet-check/``) and
ledger read passed, and the probe left nothing in the bucket. With the run's own
model, shipped as ``vcdl train`` ships it: exit 2, naming ``worker-b`` and its
code, while ``worker-a`` passes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.cli_proc import kill_group
from tests.ports import free_port
from tests.s3fixture import S3_KEY, S3_SECRET, make_bucket

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CLI = (sys.executable, "-m", "vcdl.cli", "fleet", "check")
WORKER = ("--nworkers", "1", "--nthreads", "1", "--no-dashboard", "--local-directory")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VCDL_", "DASK_", "AWS_"))}
    env.pop("PYTHONPATH", None)
    env.update(
        AWS_ACCESS_KEY_ID=S3_KEY, AWS_SECRET_ACCESS_KEY=S3_SECRET, OMP_NUM_THREADS="1", **extra
    )
    return env


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes of the test, each in its own session; every one killed at teardown."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for proc in started:
            kill_group(proc.pid)
            proc.wait(30)


def _spawn(
    procs: list[subprocess.Popen[bytes]], log: Path, argv: list[str], env: dict[str, str]
) -> None:
    with log.open("wb") as out:
        procs.append(
            subprocess.Popen(
                argv,
                env=env,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )


def _config(
    path: Path, scheduler: str, pg_url: str, bucket: str, endpoint: str, model: str
) -> None:
    path.write_text(
        "\n".join(
            [
                "[model]",
                f"factory = {json.dumps(model)}",
                "[cluster]",
                f"address = {json.dumps(scheduler)}",
                "[ledger]",
                f"url = {json.dumps(pg_url)}",
                "[store]",
                f"url = {json.dumps(f's3://{bucket}/vcdl')}",
                f"storage_options = {{ endpoint_url = {json.dumps(endpoint)} }}",
                "",
            ]
        )
    )


def _check(config: Path, home: Path, env: dict[str, str]) -> tuple[int, dict[str, Any], str]:
    done = subprocess.run(
        [*CLI, str(config), "--json", "--home", str(home), "--timeout", "50"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    doc = json.loads(done.stdout) if done.stdout.strip() else {}
    return done.returncode, doc, done.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.s3
@pytest.mark.timeout(300)
def test_fleet_check_passes_a_good_fleet_and_names_a_worker_without_the_code(
    pg_url: str, s3_endpoint: str, tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    deps, code = tmp_path / "deps", tmp_path / "code"
    deps.mkdir()
    code.mkdir()
    (deps / "fleetdep.py").write_text("VALUE = 1\n")
    (code / "fleetmodel.py").write_text("import fleetdep\n\n\ndef make(**kwargs):\n    pass\n")

    port = free_port()
    scheduler = f"tcp://127.0.0.1:{port}"
    _spawn(
        procs,
        tmp_path / "scheduler.log",
        [
            str(BIN / "dask"),
            "scheduler",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-dashboard",
        ],
        _env(),
    )
    for name, extra in (("worker-a", {"PYTHONPATH": str(deps)}), ("worker-b", {})):
        _spawn(
            procs,
            tmp_path / f"{name}.log",
            [str(BIN / "dask"), "worker", scheduler, "--name", name, *WORKER, str(tmp_path / name)],
            _env(**extra),
        )
    from distributed import Client

    deadline = time.monotonic() + 60
    while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
        assert time.monotonic() < deadline, (tmp_path / "scheduler.log").read_text()
        time.sleep(0.2)
    with Client(scheduler, timeout=30) as client:
        client.wait_for_workers(2, timeout=60)

    bucket = make_bucket(s3_endpoint)
    driver = _env(PYTHONPATH=str(deps), PREFECT_HOME=str(tmp_path / "prefect"))
    home = tmp_path / "home"

    # -- every worker can do the job ------------------------------------------------
    builtin = tmp_path / "builtin.toml"
    _config(builtin, scheduler, pg_url, bucket, s3_endpoint, "mlp")
    code_rc, doc, err = _check(builtin, home, driver)
    assert code_rc == 0, (doc, err)
    assert doc["ok"] and doc["checked"]["store_probe"] == "write-read-delete"
    assert [w["name"] for w in doc["workers"]] == ["worker-a", "worker-b"]
    for worker in doc["workers"]:
        assert worker["store"]["ok"] and worker["store"]["tls"] is False, worker
        assert worker["ledger"]["ok"] and worker["ledger"]["tls"] is False, worker
        assert worker["scheduler"]["tls"] is False and worker["code"]["ok"], worker
        assert abs(worker["clock"]["skew_s"]) <= worker["clock"]["bound_s"] + 0.05, worker
        assert worker["device"]["kind"] in ("cpu", "cuda"), worker
    import boto3

    s3 = boto3.client(
        "s3", endpoint_url=s3_endpoint, aws_access_key_id=S3_KEY, aws_secret_access_key=S3_SECRET
    )
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0  # the probes cleaned up

    # -- the run's own code: worker-b lacks what it imports ------------------------------
    own = code / "own.toml"
    _config(own, scheduler, pg_url, bucket, s3_endpoint, "fleetmodel:make")
    code_rc, doc, err = _check(own, home, driver)
    assert code_rc == 2, (doc, err)
    a, b = doc["workers"]
    assert a["ok"] and a["code"]["ok"], a
    assert not b["ok"] and b["problems"][0].startswith("code: "), b
    assert "fleetdep" in b["problems"][0], b
    assert not doc["ok"]
