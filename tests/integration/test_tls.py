"""TLS everywhere (issue 50, item 2), on loopback: each link refuses what it must, and a whole
run over all of them at once leaks none of its secrets.

One module-scoped stack, made by the test from its own short-lived CA
(tests/tlscerts.py): a Dask scheduler and two workers over ``tls://`` with
their own certificates, moto's S3 over HTTPS, a throwaway PostgreSQL server
taking only TLS with a password (tests/pgssl.py), and a Prefect server
requiring an auth string (tests/tlsservers.py). vcdl gets each setting the
way an operator gives it (docs/spot-fleet.md, "Security"): Dask's client
certificate from ``DASK_DISTRIBUTED__COMM__TLS__*``, the ledger's CA in the
URL (``sslmode=verify-full&sslrootcert=``), the store's in
``store.storage_options.client_kwargs.verify``, the password from
``PGPASSWORD`` and the auth string from ``PREFECT_API_AUTH_STRING``.

Everything runs on 127.0.0.1; tests/integration/test_netfleet_tls.py runs
Dask, the ledger and the store over TLS on the namespaced fleet.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.test_secrets import READ_PREFECT, _holding
from tests.pgssl import SslPostgres, pg_binaries_or_skip, ssl_postgres
from tests.spotfleetdoc import CA_FILE, LEDGER, S3_ENDPOINT, SCHEDULER, config_text
from tests.tlscerts import CA, Leaf
from tests.tlsservers import (
    Process,
    dask_client_env,
    dask_worker,
    https_moto,
    prefect_server,
    tls_scheduler,
    wait_health,
)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PG_PASSWORD = "Pg-Passw0rd-7d1e"
AUTH_STRING = "vcdl:Auth-Str1ng-c3a8"
AWS_SECRET = "Aws-Secr3t-51b0"


@dataclass
class Stack:
    ca: CA
    rogue: CA
    client: Leaf
    logs: Path
    env: dict[str, str]  # what the driver's processes get
    scheduler: str
    workers: list[Process]
    pg: SslPostgres
    s3: str
    prefect: str
    prefect_home: Path
    bucket: str

    @property
    def ledger_url(self) -> str:
        return self.pg.url(self.ca.cert)

    @property
    def store_options(self) -> dict[str, object]:
        return {"endpoint_url": self.s3, "client_kwargs": {"verify": str(self.ca.cert)}}


def _base_env() -> dict[str, str]:
    drop = ("PREFECT_", "AWS_", "DASK_", "PG")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return env | {
        "PYTHONPATH": str(REPO),
        "AWS_ACCESS_KEY_ID": "tls-key-id",
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
        "PGPASSWORD": PG_PASSWORD,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_API_AUTH_STRING": AUTH_STRING,
        "OMP_NUM_THREADS": "1",
    }


def _make_bucket(endpoint: str, ca: Path) -> str:
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        verify=str(ca),
        aws_access_key_id="tls-key-id",
        aws_secret_access_key=AWS_SECRET,
    )
    s3.create_bucket(Bucket="vcdl-tls")
    return "vcdl-tls"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    bindir = pg_binaries_or_skip()
    root = tmp_path_factory.mktemp("tls")
    ca, rogue = CA(root / "pki"), CA(root / "rogue", "rogue")
    logs = root / "logs"
    logs.mkdir()
    env = _base_env()
    # Prefect first: its cold start is the longest wait, the rest starts meanwhile.
    with prefect_server(root / "prefect-server", AUTH_STRING, env) as (prefect_url, server):
        env["PREFECT_API_URL"] = prefect_url
        moto = https_moto(ca.issue("s3", ips=["127.0.0.1"], dns=[]))
        moto.start()
        workers: list[Process] = []
        try:
            with (
                ssl_postgres(bindir, ca.issue("pg", dns=[]), ca.cert, PG_PASSWORD) as pg,
                tls_scheduler(ca.cert, ca.issue("scheduler"), env, logs) as address,
            ):
                worker_env = env | {"PREFECT_HOME": str(root / "worker-prefect")}
                workers += [
                    dask_worker(address, str(i), worker_env, logs, ca.cert, ca.issue(f"worker{i}"))
                    for i in range(2)
                ]
                client = ca.issue("client")
                wait_health(f"{prefect_url}/health", server, 240, "prefect server")
                yield Stack(
                    ca=ca,
                    rogue=rogue,
                    client=client,
                    logs=logs,
                    env=env | dask_client_env(ca.cert, client),
                    scheduler=address,
                    workers=workers,
                    pg=pg,
                    s3=moto.url,
                    prefect=prefect_url,
                    prefect_home=root / "prefect-server",
                    bucket=_make_bucket(moto.url, ca.cert),
                )
        finally:
            for w in workers:
                w.stop()
            moto.stop()


def _security(ca: Path, leaf: Leaf | None) -> object:
    from distributed import Security

    if leaf is None:
        return Security(tls_ca_file=str(ca), require_encryption=True)
    return Security(
        tls_ca_file=str(ca),
        tls_client_cert=str(leaf.cert),
        tls_client_key=str(leaf.key),
        require_encryption=True,
    )


def _worker_names(stack: Stack) -> list[str]:
    from distributed import Client

    with Client(stack.scheduler, security=_security(stack.ca.cert, stack.client), timeout=30) as c:
        c.wait_for_workers(2, timeout=120)
        return sorted(str(w["name"]) for w in c.scheduler_info()["workers"].values())


# --------------------------------------------------------------------------
# Dask: mutual TLS
# --------------------------------------------------------------------------


def test_dask_refuses_a_worker_and_a_client_without_a_valid_certificate(stack: Stack) -> None:
    """A worker trusting the cluster's CA but holding a certificate another CA signed
    is refused by the scheduler and never joins; a TLS client with no certificate at all
    is refused in the handshake; the CLI's check says so in one line."""
    from vcdl.api import check_scheduler
    from vcdl.errors import ConfigError

    assert _worker_names(stack) == ["0", "1"]
    impostor = dask_worker(
        stack.scheduler, "impostor", stack.env, stack.logs, stack.ca.cert, stack.rogue.issue("w")
    )
    try:
        deadline = time.monotonic() + 90
        while impostor.alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not impostor.alive(), impostor.text()[-2000:]
    finally:
        impostor.stop()
    # The scheduler rejected its certificate (the worker had accepted the scheduler's).
    said = impostor.text()
    assert "Nanny failed to start" in said and "SSL" in said, said[-2000:]
    scheduler_log = (stack.logs / "scheduler.log").read_text()
    assert "TLS handshake failed" in scheduler_log and "certificate verify failed" in scheduler_log
    assert _worker_names(stack) == ["0", "1"]

    # No certificate: the handshake itself is refused (TLS 1.3 says so at the first read).
    host, port = stack.scheduler.removeprefix("tls://").rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(stack.ca.cert))
    with (
        pytest.raises(
            ssl.SSLError, match=r"CERTIFICATE_REQUIRED|certificate required|EOF occurred"
        ),
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        tls.sendall(b"\x00")
        tls.recv(1)
    # The scheduler logs it as it sends the alert: a moment after the client has it.
    deadline = time.monotonic() + 10
    while "PEER_DID_NOT_RETURN_A_CERTIFICATE" not in (stack.logs / "scheduler.log").read_text():
        assert time.monotonic() < deadline, "the scheduler logged no refused handshake"
        time.sleep(0.2)

    import dask

    for cert in (None, stack.rogue.issue("driver")):
        tls = {"distributed.comm.tls.ca-file": str(stack.ca.cert)}
        tls |= {
            "distributed.comm.tls.client.cert": None if cert is None else str(cert.cert),
            "distributed.comm.tls.client.key": None if cert is None else str(cert.key),
        }
        with dask.config.set(tls), pytest.raises(ConfigError) as info:
            check_scheduler(stack.scheduler, timeout=10)
        said = str(info.value)
        assert "\n" not in said and ("client.cert" in said or "TLS handshake" in said), said


# --------------------------------------------------------------------------
# PostgreSQL: sslmode=verify-full
# --------------------------------------------------------------------------


def test_the_ledger_over_verify_full(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """The URL's sslmode and sslrootcert reach libpq; the server is checked, not trusted."""
    import psycopg

    from vcdl.config import parse_config
    from vcdl.runtime import open_ledger

    monkeypatch.setenv("PGPASSWORD", PG_PASSWORD)
    assert parse_config({"ledger": {"url": stack.ledger_url}}).ledger.url == stack.ledger_url
    ledger = open_ledger(stack.ledger_url)
    ledger.close()
    with psycopg.connect(stack.ledger_url.replace("postgresql+psycopg", "postgresql")) as conn:
        row = conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
        assert row == (True,)
        tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables")}
        assert "run" in tables, tables
    refused = {
        "another CA": stack.pg.url(stack.rogue.cert),
        "a name the certificate lacks": stack.pg.url(stack.ca.cert, host="localhost"),
        "no TLS": stack.pg.url(stack.ca.cert, sslmode="disable"),
    }
    for why, url in refused.items():
        with pytest.raises(Exception) as info:  # vcdl's LedgerError, or psycopg's
            open_ledger(url, create=False).close()
        said = str(info.value)
        assert PG_PASSWORD not in said, (why, said)
        assert any(w in said for w in ("certificate", "pg_hba", "SSL", "server")), (why, said)


# --------------------------------------------------------------------------
# S3 over HTTPS
# --------------------------------------------------------------------------


def test_the_store_over_https_with_the_tests_ca(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``client_kwargs.verify`` in store.storage_options carries the CA to s3fs; without it
    the endpoint's certificate is not trusted, and the error says so in one line."""
    import torch

    from vcdl.config import parse_config
    from vcdl.errors import StoreError
    from vcdl.store.weights import WeightStore

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", stack.env["AWS_ACCESS_KEY_ID"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    url = f"s3://{stack.bucket}/probe"
    cfg = parse_config({"store": {"url": url, "storage_options": stack.store_options}})
    store = WeightStore(url, dict(cfg.store.storage_options))
    store.write_state("v", {"w": torch.arange(4.0)})
    assert torch.equal(store.read_state("v")["w"], torch.arange(4.0))
    # One try: botocore retries a failed handshake 4 times more, 10 s here.
    once = {"retries": {"max_attempts": 1}}
    untrusted = WeightStore(url, {"endpoint_url": stack.s3, "config_kwargs": once})
    with pytest.raises(StoreError) as info:
        untrusted.read_state("v")
    assert "CERTIFICATE_VERIFY_FAILED" in str(info.value) or "certificate" in str(info.value)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------
# Prefect behind an auth string
# --------------------------------------------------------------------------


def _post(url: str, auth: str | None) -> int:
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(auth.encode()).decode()
    request = urllib.request.Request(url, b"{}", headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_prefect_refuses_a_client_without_the_auth_string(stack: Stack) -> None:
    flows = f"{stack.prefect}/flows/filter"
    assert _post(flows, None) == 401
    assert _post(flows, "vcdl:wrong") == 401
    assert _post(flows, AUTH_STRING) == 200


# --------------------------------------------------------------------------
# A whole run over all of them, and where its secrets did not go
# --------------------------------------------------------------------------


def _key_bodies(folder: Path) -> list[str]:
    """A line from the middle of each private key's PEM: any copy of a key holds it."""
    keys = sorted(folder.glob("*-key.pem"))
    assert len(keys) >= 6, keys  # scheduler, two workers, client, PostgreSQL, S3
    return [key.read_text().splitlines()[1] for key in keys]


def _pg_rows(url: str) -> tuple[str, set[str]]:
    """Every row of every table of the ledger's database, as text; the attempts' workers."""
    import psycopg

    libpq_url = url.replace("postgresql+psycopg", "postgresql")
    with psycopg.connect(libpq_url, password=PG_PASSWORD) as conn:
        listed = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        tables = [r[0] for r in listed]
        assert "attempt" in tables and "run" in tables, tables
        workers = {r[0] for r in conn.execute("SELECT worker FROM attempt")}
        rows = [repr(row) for t in tables for row in conn.execute(f'SELECT * FROM "{t}"')]
        return "\n".join(rows), workers


def _run_config(stack: Stack) -> str:
    """docs/spot-fleet.md's TLS config with this stack's addresses and CA, and a short run."""
    shown = config_text()
    for placeholder, here in (
        (SCHEDULER, stack.scheduler),
        (S3_ENDPOINT, stack.s3),
        ("s3://my-vcdl-bucket/vcdl", f"s3://{stack.bucket}/store"),
        (LEDGER, f"postgres@127.0.0.1:{stack.pg.port}/postgres"),
        (CA_FILE, str(stack.ca.cert)),
    ):
        assert placeholder in shown, placeholder
        shown = shown.replace(placeholder, here)
    short = "[run]\nname = 'tls-run'\nepochs = 1\n[data]\nname = 'digits'\nshards = 2\n"
    return short + "[model]\nfactory = 'cnn2d'\n" + shown


def test_a_run_over_tls_everywhere_leaks_no_secret(stack: Stack, tmp_path: Path) -> None:
    cfg = tmp_path / "tls.toml"
    cfg.write_text(_run_config(stack))
    home, driver_prefect = tmp_path / "home", tmp_path / "prefect"
    env = stack.env | {"PREFECT_HOME": str(driver_prefect)}

    def vcdl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "vcdl.cli", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
        )

    started = time.monotonic()
    train = vcdl("train", str(cfg), "--home", str(home), "--json", "--verbose")
    print(f"train: {time.monotonic() - started:.1f} s")
    (tmp_path / "train.log").write_text(train.stderr)
    assert train.returncode == 0, train.stderr[-3000:]
    summary = json.loads(train.stdout)
    assert summary["state"] == "completed" and summary["head_version"] == 2, summary
    rows, workers = _pg_rows(stack.ledger_url)
    # Both workers wrote their attempts' rows over verify-full themselves.
    assert len(workers) == 2 and all(w.startswith("tls://") for w in workers), workers
    prefect = subprocess.run(
        [sys.executable, "-c", READ_PREFECT],
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    print(f"prefect read: {time.monotonic() - started:.1f} s")
    assert prefect.returncode == 0, prefect.stderr[-3000:]
    served = json.loads(prefect.stdout)
    assert served["flow_runs"] and served["artifacts"] and served["logs"], list(served)

    auth_b64 = base64.b64encode(AUTH_STRING.encode()).decode()
    secrets = [PG_PASSWORD, AUTH_STRING, AUTH_STRING.split(":", 1)[1], auth_b64, AWS_SECRET]
    secrets += _key_bodies(stack.ca.folder)
    assert _holding(stack.ca.folder, secrets[-1]), "the search finds a key where it is"
    import s3fs

    fs = s3fs.S3FileSystem(
        key="tls-key-id",
        secret=AWS_SECRET,
        client_kwargs={"endpoint_url": stack.s3, "verify": str(stack.ca.cert)},
    )
    objects = fs.find(stack.bucket)
    assert [p for p in objects if "/versions/" in p], objects[:20]
    in_bucket = b"\n".join(fs.cat_file(p) for p in objects)
    shown = train.stdout + train.stderr
    for secret in secrets:
        assert secret not in shown
        assert secret not in rows
        assert secret not in prefect.stdout
        assert secret.encode() not in in_bucket
        assert not _holding(home, secret)
        assert not _holding(driver_prefect, secret)
        assert not _holding(stack.logs, secret)  # the scheduler's and workers' logs
        assert not _holding(stack.prefect_home, secret)  # the Prefect server's database
