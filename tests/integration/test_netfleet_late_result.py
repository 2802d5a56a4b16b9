"""A worker cut off from the scheduler mid-attempt: its subtask reissued, its late result recorded.

Issue 50, item 5, on the namespaced fleet (benchmarks/netfleet/): a real
run (``vcdl train``, mnist1d, 2 shards, 3 epochs) on worker hosts ``a`` and
``b`` behind 40 ms links, every service reached over them, PostgreSQL
ledger, S3 (moto) store. Host ``a``'s first attempt holds at its first
forward pass (tests/integration/held_model.py). The test then cuts ``a``'s
link in ``reset`` mode: every connection of the host is reset (the
scheduler's stream to the worker among them) and new ones are refused, as
when a NAT or load balancer on the way forgets the host. The harness cuts
links, not routes: the store and the ledger are cut from ``a`` too.

What Dask does (distributed 2026.8, ``worker.py``): the scheduler removes a
worker whose stream breaks and hands its task to another; the worker, whose
``handle_scheduler`` ends, closes itself (``reason=worker-handle-scheduler-
connection-broken``), asks its nanny to close too, and waits up to 30 s
(``Worker.close(timeout=30)``) for the task thread it runs, then exits. So
the attempt is not killed with the link: it may go on and land its result
in that window. The test lets the held attempt go on once the link is back
and the reissued attempt merged, and asserts from the ledger: the run
completes, every subtask merged exactly once, the late attempt recorded as
``duplicate`` after it finished, ``audit --deep`` clean, and nothing of the
fleet left. It prints the timeline (seconds from the cut).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest

from benchmarks.netfleet import LinkProfile, netns, session
from benchmarks.netfleet.dask_hosts import start_scheduler, start_worker
from tests.integration.held_model import ENV
from tests.integration.test_netfleet_run import _env, _write_config
from tests.netfleetfixture import REPO, make_fleet
from tests.s3fixture import S3_KEY, S3_SECRET, make_bucket

pytestmark = [
    pytest.mark.slow,
    pytest.mark.alone,
    pytest.mark.postgres,
    pytest.mark.s3,
    pytest.mark.timeout(600),
]

RUN = "netfleet-late"
LINK = LinkProfile(latency_ms=40, jitter_ms=5, mbit=100)
CUT_S = 10.0
HOLD = "/tmp/vcdl-hold"  # on host a's own /tmp
# The late result is recorded a duplicate by its own finish (its subtask
# merged elsewhere by then), also past the run's end; the epochs after the
# cut's keep the run going while it lands, as on a fleet with work left.
EPOCHS = 3


def _wait(what: str, check: object, timeout: float, step: float = 0.2) -> float:
    """Poll ``check()`` until true; the monotonic time it became so (fails after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return time.monotonic()
        time.sleep(step)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


def test_a_cut_off_workers_late_result_is_a_recorded_duplicate(
    pg_url: str,
    s3_endpoint: str,
    prefect_api_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from distributed import Client

    from vcdl.ledger import Ledger
    from vcdl.runtime import run_ref
    from vcdl.views.audit import audit_run

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET)
    ledger = Ledger(pg_url)  # the test's own view, on loopback: never cut
    with make_fleet(["a", "b"], tmp_path / "logs", {"a": LINK, "b": LINK}) as fleet:
        assert fleet.session is not None
        sid = fleet.session.sid
        env = _env()
        scheduler = start_scheduler(fleet, env)
        host_env = dict(
            env,
            HOME="/tmp/home",
            PREFECT_API_URL=fleet.expose_url("prefect", prefect_api_url),
            PREFECT_HOME="/tmp/prefect",
            MPLCONFIGDIR="/tmp/mpl",
        )
        worker_a = start_worker(fleet, "a", scheduler, dict(host_env, **{ENV: HOLD}))
        start_worker(fleet, "b", scheduler, host_env)

        base = tomllib.loads((REPO / "examples" / "mnist1d.toml").read_text())
        base["run"].update(name=RUN, epochs=EPOCHS)
        base["data"].update(samples=2000, shards=2)
        base["model"] = {"factory": "tests.integration.held_model:held", "kwargs": {}}
        base["cluster"] = {"address": scheduler}
        base["ledger"] = {"url": fleet.expose_url("ledger", pg_url)}
        bucket = make_bucket(s3_endpoint)
        s3_url = fleet.expose_url("s3", s3_endpoint)
        base["store"] = {"url": f"s3://{bucket}/vcdl", "storage_options": {"endpoint_url": s3_url}}
        cfg = tmp_path / "run.toml"
        _write_config(cfg, base)

        with Client(scheduler, timeout=60) as client:
            client.wait_for_workers(2, timeout=90)
            address = {w["name"]: a for a, w in client.scheduler_info()["workers"].items()}
        driver_log = tmp_path / "driver.log"
        with driver_log.open("wb") as out:
            driver = subprocess.Popen(
                [sys.executable, "-m", "vcdl.cli", "train", str(cfg), "--home", str(tmp_path)],
                env=dict(env, PREFECT_API_URL=host_env["PREFECT_API_URL"],
                         PREFECT_HOME=str(tmp_path / "pf")),
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            host_tmp = f"/proc/{worker_a.pid}/root{os.path.dirname(HOLD)}"
            held_file = f"{host_tmp}/{os.path.basename(HOLD)}.held"
            held = _wait("host a's attempt holds", lambda: os.path.exists(held_file), 300)
            # Keep the host's /tmp reachable even once its processes are gone.
            tmp_fd = os.open(host_tmp, os.O_RDONLY | os.O_DIRECTORY)
            _wait(
                "host a's attempt in the ledger",
                lambda: [a for a in ledger.attempts(RUN) if a.worker == address["a"]],
                30,
            )
            late = next(a for a in ledger.attempts(RUN) if a.worker == address["a"])
            assert late.state == "running", late

            gone: dict[str, float] = {}

            def watch_host() -> None:  # when host a's last process exited
                while not gone and time.monotonic() < cut + 300:
                    if not netns.namespace_pids(fleet.hosts["a"].namespace):
                        gone["a"] = time.monotonic()
                    time.sleep(0.2)

            cut, cut_wall = time.monotonic(), time.time()
            fleet.cut("a", CUT_S, "reset")
            threading.Thread(target=watch_host, daemon=True).start()

            def merged_elsewhere() -> bool:
                sub = next(s for s in ledger.subtasks(RUN, late.epoch) if s.id == late.subtask_id)
                return sub.state == "merged"

            merged = _wait("the reissued subtask merged", merged_elsewhere, 120)
            back = max(merged, cut + CUT_S)
            time.sleep(max(0.0, back - time.monotonic()))
            released = time.monotonic()
            os.close(os.open(f"{os.path.basename(HOLD)}.go", os.O_CREAT, dir_fd=tmp_fd))
            os.close(tmp_fd)
            rc = driver.wait(300)
        finally:
            if driver.poll() is None:
                driver.kill()
        ended = time.monotonic()
        log = driver_log.read_text(errors="replace")
        print(log[-3000:])
        assert rc == 0, log[-4000:]
        problems = audit_run(run_ref(RUN, ledger_url=pg_url), deep=True)
        worker_a_log = (fleet.logs / "worker-a.log").read_text(errors="replace")
        scheduler_log = (fleet.logs / "scheduler.log").read_text(errors="replace")

    try:
        run = ledger.get_run(RUN)
        attempts = ledger.attempts(RUN)
        subtasks = ledger.subtasks(RUN)
    finally:
        ledger.close()
    final = next(a for a in attempts if a.id == late.id)
    again = [a for a in attempts if a.subtask_id == late.subtask_id and a.id != late.id]
    wall = {a.id: a for a in attempts}

    def since_cut(stamp: object) -> str:
        if stamp is None:
            return "-"
        return f"{stamp.timestamp() - cut_wall:+.1f}"  # type: ignore[attr-defined]

    print("worker a:", "\n".join(worker_a_log.splitlines()[-25:]))
    print("scheduler:", "\n".join(scheduler_log.splitlines()[-15:]))
    print(
        f"timeline (s from the cut of {CUT_S:.0f} s): held {held - cut:+.1f}, "
        f"merged elsewhere {merged - cut:+.1f}, released {released - cut:+.1f}, "
        f"host a's processes gone {gone['a'] - cut if gone else float('nan'):+.1f}, "
        f"run ended {ended - cut:+.1f}; late attempt finished {since_cut(final.finished_at)} "
        f"as {final.state!r} ({final.reason}); reissued: "
        + ", ".join(f"{a.worker} {a.state} started {since_cut(a.started_at)}" for a in again)
        + f"; attempts: {sorted((a.epoch, a.shard, a.state) for a in wall.values())}"
    )
    assert run.state == "completed", run
    assert problems == [], problems
    for s in subtasks:
        n = [a for a in attempts if a.subtask_id == s.id and a.state == "merged"]
        assert s.state == "merged" and len(n) == 1, (s, n)
    # The subtask went elsewhere and merged there; the cut-off attempt came back late.
    assert any(
        a.state == "merged" and a.worker != address["a"] and a.started_at.timestamp() > cut_wall
        for a in again
    ), again
    # The worker closed itself when its stream broke, and lived on (its task
    # thread joined) until the attempt had written its result.
    assert "worker-handle-scheduler-connection-broken" in worker_a_log, worker_a_log[-3000:]
    assert gone, "host a's processes outlived the test's watch"
    assert final.state == "duplicate", final
    assert final.finished_at is not None
    # Its result came from the worker after the release: its finish recorded it
    # a duplicate of the merge from b, in the same statement.
    assert "by another attempt" in (final.reason or ""), final
    assert final.result_uri is not None and final.samples, final
    assert final.finished_at.timestamp() - cut_wall > released - cut - 1
    # Nothing of the fleet is left.
    assert not [n for n in netns.namespace_names() if n.startswith(f"{session.PREFIX}{sid}")]
    assert not [n for n in netns.link_names() if n.startswith(f"{session.PREFIX}{sid}")]
    assert all(p.poll() is not None for h in fleet.hosts.values() for p in h.procs)
