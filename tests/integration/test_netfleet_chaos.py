"""Issue 50's chaos run, in a shorter form, on the namespaced fleet with TLS on every link.

Four worker hosts behind 80 ms (+-8), 100 Mbit/s links (benchmarks/netfleet/);
Dask over ``tls://`` with the test's CA, PostgreSQL taking TLS only
(``sslmode=verify-full``), S3 over HTTPS, as in test_netfleet_tls.py (whose
set-up this follows). While ``examples/mnist1d.toml`` runs (shortened: 6000
samples in 8 shards, 2 epochs), a chaos thread makes a worker host vanish
about every 20 s (every process of it SIGKILLed; its worker restarted 3 s
later, as a replacement VM would join) and cuts one other host silently
(``down``: every packet dropped) for 30 s. The run must complete with
every subtask merged exactly once and ``audit --deep`` clean; the final
accuracy is printed (the issue's >= 97 % target is for the full run, not
this short one). The full run, ``long`` (tens of minutes here), is the
whole example with, besides, the driver cut from the store alone for 30 s
(the proxy's per-route cut: its scheduler and ledger stay reachable), and
must end at >= 97 %. The
chaos begins 15 s after the driver, while it installs its worker plugins:
a host lost then failed the run before
flows/workarounds/plugin_broadcast.py.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.netfleet import LinkProfile, netns
from benchmarks.netfleet.dask_hosts import start_scheduler, start_worker
from benchmarks.netfleet.proxy import DRIVER, route_link
from tests.integration.test_netfleet_run import _write_config
from tests.integration.test_netfleet_tls import PG_PASSWORD, _env
from tests.integration.test_netfleet_tls import shared_pki as shared_pki  # the fixture
from tests.netfleetfixture import REPO, make_fleet
from tests.pgssl import pg_binaries_or_skip, ssl_postgres
from tests.tlscerts import CA
from tests.tlsservers import dask_client_env, https_moto

pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(600)]

RUN = "netfleet-chaos"
HOSTS = ["a", "b", "c", "d"]
LINK = LinkProfile(latency_ms=80, jitter_ms=8, mbit=100)
VANISH_EVERY_S = 20.0
BACK_AFTER_S = 3.0
PARTITION_S = 30.0


@dataclass(frozen=True)
class Form:
    """How much of the chaos run: the run's size, the driver's store cut, what must hold."""

    epochs: int | None  # None: the example's own
    samples: int | None
    driver_store_cut: bool
    min_accuracy: float
    timeout: float


# Two epochs: long enough for the cut and several vanishings (the full form is the
# target's measurement); a third cost CI a minute.
SHORT = Form(epochs=2, samples=6000, driver_store_cut=False, min_accuracy=0.0, timeout=480)
# The issue's target: the whole example, a worker host's silent cut and the
# driver's own cut from the store (its scheduler and ledger still reachable).
FULL = Form(epochs=None, samples=None, driver_store_cut=True, min_accuracy=0.97, timeout=2400)


def test_chaos_on_four_hosts_with_tls(
    prefect_api_url: str, shared_pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _chaos_run(SHORT, prefect_api_url, shared_pki, tmp_path, monkeypatch)


@pytest.mark.long
@pytest.mark.timeout(2700)
def test_the_full_chaos_target(
    prefect_api_url: str, shared_pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole examples/mnist1d.toml under the same chaos plus a 30-s cut of the
    driver from the store: >= 97 %, audit clean, every subtask merged once."""
    _chaos_run(FULL, prefect_api_url, shared_pki, tmp_path, monkeypatch)


def _chaos_run(
    form: Form,
    prefect_api_url: str,
    shared_pki: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import boto3

    from vcdl.ledger import Ledger
    from vcdl.runtime import run_ref
    from vcdl.views.audit import audit_run

    bindir = pg_binaries_or_skip()
    env = _env()
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "PGPASSWORD"):
        monkeypatch.setenv(key, env[key])
    events: list[str] = []
    with make_fleet(HOSTS, tmp_path / "logs", dict.fromkeys(HOSTS, LINK)) as fleet:
        gateway = fleet.gateway
        ca = CA(shared_pki)

        def flags(name: str) -> list[str]:
            leaf = ca.issue(name, ips=["127.0.0.1", gateway], dns=[])
            return [f"--tls-ca-file={ca.cert}", f"--tls-cert={leaf.cert}", f"--tls-key={leaf.key}"]

        scheduler = start_scheduler(fleet, env, tls=flags("scheduler"))
        host_env = env | {
            "HOME": "/tmp/home",
            "PREFECT_API_URL": fleet.expose_url("prefect", prefect_api_url),
            "PREFECT_HOME": "/tmp/prefect",
            "MPLCONFIGDIR": "/tmp/mpl",
        }
        worker_flags = {h: ("--nthreads", "1", *flags(h)) for h in HOSTS}

        def worker(host: str) -> None:
            start_worker(fleet, host, scheduler, host_env, worker_flags[host])

        for host in HOSTS:
            worker(host)
        s3 = https_moto(ca.issue("s3", ips=[gateway], dns=[]))
        s3.start()
        pg_cert = ca.issue("pg", ips=[gateway], dns=[])
        try:
            with ssl_postgres(bindir, pg_cert, ca.cert, PG_PASSWORD) as pg:
                pg_host, pg_port = fleet.expose("ledger", ("127.0.0.1", pg.port))
                ledger_url = pg.url(ca.cert, host=pg_host).replace(f":{pg.port}/", f":{pg_port}/")
                s3_url = fleet.expose_url("s3", s3.url)
                boto3.client(
                    "s3", endpoint_url=s3_url, verify=str(ca.cert),
                    aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                    aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                ).create_bucket(Bucket="vcdl-chaos")  # fmt: skip
                base = tomllib.loads((REPO / "examples" / "mnist1d.toml").read_text())
                base["run"]["name"] = RUN
                if form.epochs is not None:
                    base["run"]["epochs"] = form.epochs
                if form.samples is not None:
                    base["data"]["samples"] = form.samples
                base["cluster"] = {"address": scheduler}
                base["ledger"] = {"url": ledger_url}
                base["store"] = {
                    "url": "s3://vcdl-chaos/vcdl",
                    "storage_options": {
                        "endpoint_url": s3_url,
                        "client_kwargs": {"verify": str(ca.cert)},
                    },
                }
                cfg = tmp_path / "run.toml"
                _write_config(cfg, base)
                client_leaf = ca.issue("client", ips=["127.0.0.1", gateway], dns=[])
                driver_env = env | dask_client_env(ca.cert, client_leaf)
                driver_env |= {
                    "PREFECT_API_URL": host_env["PREFECT_API_URL"],
                    "PREFECT_HOME": str(tmp_path / "pf"),
                }
                started = time.monotonic()
                with (tmp_path / "driver.log").open("wb") as out:
                    driver = subprocess.Popen(
                        [sys.executable, "-m", "vcdl.cli", "train", str(cfg),
                         "--home", str(tmp_path / "home")],
                        env=driver_env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                    )  # fmt: skip
                stop = threading.Event()

                def chaos() -> None:
                    # From 15 s after the driver started (it is installing its
                    # plugins on the workers then): the partition first (host d,
                    # silent), then a vanishing host every ~20 s, never the one cut
                    # at that moment.
                    if stop.wait(15):
                        return
                    fleet.cut("d", PARTITION_S, "down")
                    cut_at = time.monotonic()
                    events.append(f"{time.monotonic() - started:.0f}s cut d {PARTITION_S:.0f}s")
                    if form.driver_store_cut:
                        # Once d is back: the driver alone loses the store, mid-run,
                        # while hosts go on vanishing.
                        def cut_driver() -> None:
                            if stop.is_set():
                                return
                            fleet.cut(route_link(DRIVER, "s3"), PARTITION_S, "stall")
                            at = time.monotonic() - started
                            events.append(f"{at:.0f}s cut driver>s3 {PARTITION_S:.0f}s")

                        timer = threading.Timer(PARTITION_S + VANISH_EVERY_S, cut_driver)
                        timer.daemon = True
                        timer.start()
                    turn = 0
                    while not stop.wait(VANISH_EVERY_S / 2 if turn == 0 else VANISH_EVERY_S):
                        candidates = ["a", "b", "c"]
                        if time.monotonic() > cut_at + PARTITION_S:
                            candidates.append("d")
                            # Its worker closed itself when its stream broke in the
                            # cut: a supervisor (systemd) would start it again.
                            if not netns.namespace_pids(fleet.hosts["d"].namespace):
                                worker("d")
                                events.append(f"{time.monotonic() - started:.0f}s d back")
                        host = candidates[turn % len(candidates)]
                        turn += 1
                        killed = fleet.vanish(host)
                        events.append(
                            f"{time.monotonic() - started:.0f}s vanish {host} ({len(killed)})"
                        )
                        if stop.wait(BACK_AFTER_S):
                            return
                        worker(host)

                thread = threading.Thread(target=chaos, daemon=True)
                thread.start()
                try:
                    rc = driver.wait(form.timeout)
                finally:
                    stop.set()
                    thread.join(30)
                    if driver.poll() is None:
                        driver.kill()
                ran = time.monotonic() - started
                log = (tmp_path / "driver.log").read_text(errors="replace")
                print(log[-2500:])
                assert rc == 0, log[-4000:]
                problems = audit_run(run_ref(RUN, ledger_url=ledger_url), deep=True)
                ledger = Ledger(ledger_url)
                try:
                    run = ledger.get_run(RUN)
                    attempts = ledger.attempts(RUN)
                    subtasks = ledger.subtasks(RUN)
                    evaluations = ledger.evaluations(RUN)
                finally:
                    ledger.close()
        finally:
            s3.stop()
    states: dict[str, int] = {}
    for a in attempts:
        states[a.state] = states.get(a.state, 0) + 1
    last = max(evaluations, key=lambda e: e.epoch or -1) if evaluations else None
    print(
        f"chaos: {events}; run {ran:.0f}s; attempts {states}; "
        f"final accuracy {last.accuracy if last else None} (epoch {last.epoch if last else '-'})"
    )
    assert run.state == "completed", run
    assert problems == [], problems
    for s in subtasks:
        merged = [a for a in attempts if a.subtask_id == s.id and a.state == "merged"]
        assert s.state == "merged" and len(merged) == 1, (s, merged)
    assert any("vanish" in e for e in events) and any("cut d" in e for e in events), events
    if form.driver_store_cut:
        assert any("driver>s3" in e for e in events), events
    assert last is not None and (last.accuracy or 0.0) >= form.min_accuracy, last
