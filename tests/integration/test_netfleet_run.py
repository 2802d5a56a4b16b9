"""A short real vcdl run on two namespaced worker hosts, every service reached over their links.

The driver (``vcdl train``) runs in the root namespace; two ``dask worker``
processes run on hosts ``a`` and ``b``, each a network namespace behind a
40 ms (+-5) round-trip, 100 Mbit/s link, with /tmp and the driver's $HOME
hidden from them. The scheduler, moto's S3, PostgreSQL (the workers write
their attempts to the ledger themselves) and Prefect's API listen on the
root namespace's loopback; the workers reach them only through the fleet's
proxy. The run must complete with both hosts' attempts merged; what each
link carried shows the workers' traffic went over it; a task on each worker
shows that it cannot see the driver's home, which the driver can.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from benchmarks.netfleet import LinkProfile
from benchmarks.netfleet.dask_hosts import start_scheduler, start_worker
from tests.netfleetfixture import REPO, make_fleet
from tests.procenv import clean_env
from tests.s3fixture import S3_KEY, S3_SECRET, make_bucket

pytestmark = [
    pytest.mark.slow,
    pytest.mark.alone,
    pytest.mark.postgres,
    pytest.mark.s3,
    pytest.mark.timeout(600),
]

RUN = "netfleet"
LINK = LinkProfile(latency_ms=40, jitter_ms=5, mbit=100)


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)  # a JSON string or number is a valid TOML one


def _write_config(path: Path, sections: dict[str, dict[str, Any]]) -> None:
    lines = []
    for section, values in sections.items():
        lines += [f"[{section}]", *(f"{k} = {_toml(v)}" for k, v in values.items()), ""]
    path.write_text("\n".join(lines))


def _env() -> dict[str, str]:
    return clean_env(
        AWS_ACCESS_KEY_ID=S3_KEY,
        AWS_SECRET_ACCESS_KEY=S3_SECRET,
        VCDL_ALLOW_IMPORTS=os.environ.get("VCDL_ALLOW_IMPORTS", ""),
    )


def test_a_short_run_on_two_hosts_over_slow_links(
    pg_url: str, s3_endpoint: str, prefect_api_url: str, tmp_path: Path
) -> None:
    from distributed import Client

    from vcdl.ledger import Ledger

    started = time.monotonic()
    profiles = {"a": LINK, "b": LINK}
    with make_fleet(["a", "b"], tmp_path / "logs", profiles) as fleet:
        env = _env()
        scheduler = start_scheduler(fleet, env)
        ledger_url = fleet.expose_url("ledger", pg_url)
        s3_url = fleet.expose_url("s3", s3_endpoint)
        prefect_url = fleet.expose_url("prefect", prefect_api_url)
        host_env = dict(
            env,
            HOME="/tmp/home",  # the host's own tmpfs
            PREFECT_API_URL=prefect_url,
            PREFECT_HOME="/tmp/prefect",
            MPLCONFIGDIR="/tmp/mpl",
        )
        for host in ("a", "b"):
            start_worker(fleet, host, scheduler, host_env)

        base = tomllib.loads((REPO / "examples" / "mnist1d.toml").read_text())
        base["run"].update(name=RUN, epochs=1)
        base["data"].update(samples=4000, shards=4)
        base["cluster"] = {"address": scheduler}
        base["ledger"] = {"url": ledger_url}
        bucket = make_bucket(s3_endpoint)
        base["store"] = {"url": f"s3://{bucket}/vcdl", "storage_options": {"endpoint_url": s3_url}}
        cfg = tmp_path / "run.toml"
        _write_config(cfg, base)
        home = tmp_path / "home"

        with Client(scheduler, timeout=60) as client:
            client.wait_for_workers(2, timeout=90)
            up = time.monotonic() - started
            proc = subprocess.run(
                [sys.executable, "-m", "vcdl.cli", "train", str(cfg), "--home", str(home)],
                env=dict(env, PREFECT_API_URL=prefect_url, PREFECT_HOME=str(tmp_path / "pf")),
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=420,
            )
            ran = time.monotonic() - started - up
            print(proc.stdout[-1500:])
            assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
            # The driver's home is there for the driver, not for a worker's task.
            assert home.is_dir()
            seen = client.run(os.path.exists, str(home))
            assert sorted(seen.values()) == [False, False], seen
            contacts = set(client.scheduler_info()["workers"])

        carried = {host: fleet.carried(host) for host in ("a", "b")}

    ledger = Ledger(pg_url)
    try:
        attempts = ledger.attempts(RUN)
        run = ledger.get_run(RUN)
    finally:
        ledger.close()
    print(
        f"fleet up in {up:.1f}s, run {ran:.1f}s; {len(attempts)} attempts; "
        f"bytes over each link: {carried}"
    )
    assert run is not None and run.state == "completed", run
    merged = [a for a in attempts if a.state == "merged"]
    assert {a.worker for a in merged} == contacts, (contacts, [a.worker for a in merged])
    gateway = scheduler.removeprefix("tcp://").rsplit(":", 1)[0]
    assert all(a.worker.startswith(f"tcp://{gateway}:") for a in attempts)
    for host, routes in carried.items():
        # Scheduler, store, ledger, Prefect: each crossed the host's link.
        for route in ("scheduler", "s3", "ledger", "prefect"):
            assert routes.get(route, 0) > 0, (host, routes)
