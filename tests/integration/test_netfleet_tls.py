"""A short vcdl run on two namespaced worker hosts with TLS on every link they use.

The fleet of benchmarks/netfleet/ (docs/network-fleet.md): hosts ``a`` and
``b`` reach the root namespace's services only through the proxy at the
bridge's address. Here the Dask scheduler and workers speak ``tls://`` with
certificates of the test's CA, the ledger is a PostgreSQL server taking TLS
only (``sslmode=verify-full``), and S3 is served over HTTPS; the servers'
certificates name the bridge's address, which is what every side, driver
included, connects to. Prefect's API is the session's, over plain HTTP (the
auth string is tested in tests/integration/test_tls.py). The certificates
are in /dev/shm, which the hosts share with the driver (their /tmp is their
own), at the same paths on every side, as the run's config needs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.netfleet import LinkProfile
from benchmarks.netfleet.dask_hosts import start_scheduler, start_worker
from tests.netfleetfixture import REPO, make_fleet
from tests.pgssl import pg_binaries_or_skip, ssl_postgres
from tests.procenv import DROPPED, clean_env
from tests.tlscerts import CA
from tests.tlsservers import dask_client_env, https_moto

pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(600)]

RUN = "netfleet-tls"
LINK = LinkProfile(latency_ms=20, jitter_ms=2, mbit=100)
PG_PASSWORD = "Fleet-Pg-Passw0rd"


@pytest.fixture
def shared_pki() -> Iterator[Path]:
    """A folder the hosts see at the same path as the driver."""
    folder = Path(tempfile.mkdtemp(prefix="vcdl-tls-", dir="/dev/shm"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _env() -> dict[str, str]:
    return clean_env(
        drop=(*DROPPED, "PG"),
        AWS_ACCESS_KEY_ID="fleet-key-id",
        AWS_SECRET_ACCESS_KEY="fleet-secret",
        PGPASSWORD=PG_PASSWORD,
        VCDL_ALLOW_IMPORTS=os.environ.get("VCDL_ALLOW_IMPORTS", ""),
    )


def test_a_short_run_on_two_hosts_with_tls_on_every_link(
    prefect_api_url: str, shared_pki: Path, tmp_path: Path
) -> None:
    import boto3
    from distributed import Client, Security

    bindir = pg_binaries_or_skip()
    started = time.monotonic()
    with make_fleet(["a", "b"], tmp_path / "logs", {"a": LINK, "b": LINK}) as fleet:
        gateway = fleet.gateway
        ca = CA(shared_pki)
        env = _env()

        def flags(name: str) -> list[str]:
            leaf = ca.issue(name, ips=["127.0.0.1", gateway], dns=[])
            return [f"--tls-ca-file={ca.cert}", f"--tls-cert={leaf.cert}", f"--tls-key={leaf.key}"]

        scheduler = start_scheduler(fleet, env, tls=flags("scheduler"))
        assert scheduler.startswith(f"tls://{gateway}:"), scheduler
        prefect_url = fleet.expose_url("prefect", prefect_api_url)
        host_env = env | {
            "HOME": "/tmp/home",  # the host's own tmpfs
            "PREFECT_API_URL": prefect_url,
            "PREFECT_HOME": "/tmp/prefect",
            "MPLCONFIGDIR": "/tmp/mpl",
        }
        for host in ("a", "b"):
            start_worker(fleet, host, scheduler, host_env, ("--nthreads", "1", *flags(host)))

        s3 = https_moto(ca.issue("s3", ips=[gateway], dns=[]))
        s3.start()
        pg_cert = ca.issue("pg", ips=[gateway], dns=[])
        try:
            with ssl_postgres(bindir, pg_cert, ca.cert, PG_PASSWORD) as pg:
                pg_host, pg_port = fleet.expose("ledger", ("127.0.0.1", pg.port))
                ledger_url = pg.url(ca.cert, host=pg_host).replace(f":{pg.port}/", f":{pg_port}/")
                s3_url = fleet.expose_url("s3", s3.url)
                boto3.client(
                    "s3",
                    endpoint_url=s3_url,
                    verify=str(ca.cert),
                    aws_access_key_id="fleet-key-id",
                    aws_secret_access_key="fleet-secret",
                ).create_bucket(Bucket="vcdl-fleet-tls")
                cfg = tmp_path / "run.toml"
                cfg.write_text(
                    f"[run]\nname = '{RUN}'\nepochs = 1\n[data]\nname = 'digits'\nshards = 2\n"
                    f"[model]\nfactory = 'cnn2d'\n[cluster]\naddress = '{scheduler}'\n"
                    "[store]\nurl = 's3://vcdl-fleet-tls/vcdl'\n"
                    f"storage_options = {{ endpoint_url = '{s3_url}', "
                    f"client_kwargs = {{ verify = '{ca.cert}' }} }}\n"
                    f"[ledger]\nurl = '{ledger_url}'\n"
                )
                client_leaf = ca.issue("client", ips=["127.0.0.1", gateway], dns=[])
                security = Security(
                    tls_ca_file=str(ca.cert),
                    tls_client_cert=str(client_leaf.cert),
                    tls_client_key=str(client_leaf.key),
                    require_encryption=True,
                )
                with Client(scheduler, security=security, timeout=60) as client:
                    client.wait_for_workers(2, timeout=120)
                    up = time.monotonic() - started
                    home = str(tmp_path / "home")
                    driver_env = env | dask_client_env(ca.cert, client_leaf)
                    driver_env |= {
                        "PREFECT_API_URL": prefect_url,
                        "PREFECT_HOME": str(tmp_path / "pf"),
                    }
                    proc = subprocess.run(
                        [sys.executable, "-m", "vcdl.cli", "train", str(cfg), "--home", home],
                        env=driver_env,
                        cwd=REPO,
                        capture_output=True,
                        text=True,
                        timeout=420,
                    )
                    ran = time.monotonic() - started - up
                    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
                    contacts = set(client.scheduler_info()["workers"])

                import psycopg

                libpq = ledger_url.replace("postgresql+psycopg", "postgresql")
                with psycopg.connect(libpq, password=PG_PASSWORD) as conn:
                    ssl_on = conn.execute(
                        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
                    ).fetchone()
                    merged = {
                        r[0]
                        for r in conn.execute("SELECT worker FROM attempt WHERE state = 'merged'")
                    }
                    state = conn.execute("SELECT state FROM run WHERE name = %s", (RUN,)).fetchone()
            carried = {host: fleet.carried(host) for host in ("a", "b")}
        finally:
            s3.stop()
    print(f"fleet up in {up:.1f}s, run {ran:.1f}s; bytes over each link: {carried}")
    assert ssl_on == (True,) and state == ("completed",), (ssl_on, state)
    assert merged == contacts and all(w.startswith(f"tls://{gateway}:") for w in merged), merged
    for host, routes in carried.items():
        # Scheduler, store and ledger, each over TLS, each crossed the host's link.
        for route in ("scheduler", "s3", "ledger"):
            assert routes.get(route, 0) > 0, (host, routes)
