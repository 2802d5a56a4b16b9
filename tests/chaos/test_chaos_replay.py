"""Issue 53's acceptance: a run under chaos replays bit for bit (``vcdl replay RUN --json``).

A small form of the chaos recipe of ``tests/chaos/test_chaos_run.py``: a
``vcdl train --preempt …`` subprocess of ``examples/mnist1d.toml`` (fewer
samples and epochs, a narrower model) whose workers the preemption simulator
SIGKILLs and notices at random, with checkpoints every 0.1 s so that a killed
attempt leaves one to resume. The simulator alone did not make a short run
eventful reliably (its victims are often a replacement just started, between
attempts: one run sent 8 notices and none stopped an attempt, others 3 or 4
kills), so the test adds aimed events of its own, read from the ledger: a
SIGKILL to the worker of a running attempt that has a checkpoint until 3
attempts were killed, then a notice (SIGTERM, SIGKILL after 1 s of grace, as
the simulator does) to the worker of another such attempt until a partial
result is merged. Once the ledger shows killed attempts, a merged attempt that
resumed a killed one's checkpoint and a merged partial result of a notice, and
an epoch is complete, the driver is SIGKILLed and ``vcdl resume`` finishes the
run under the simulator. Then ``vcdl replay RUN --json``, as a user runs it,
must re-make every version bit for bit; the ledger's events are asserted, so
the test cannot pass on a run without them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from subprocess import Popen

import psutil
import pytest

from benchmarks.cli_proc import log_tail, reap, start_vcdl
from tests import prefecthome
from vcdl.chaos import sent_counts
from vcdl.ledger import Attempt, Ledger

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "mnist1d.toml"

EPOCHS = 3
# Attempts of ~1.5 s of training (8 local epochs of a 1600-row shard) that
# checkpoint every 0.1 s: a kill mid-attempt leaves a checkpoint for the
# replacement.
SMALL = [
    f"run.epochs={EPOCHS}",
    "data.samples=8000",
    "data.shards=4",
    "model.kwargs.width=16",
    "train.local_epochs=8",
    "fault.checkpoint_seconds=0.1",
]
# The simulator's random events besides the aimed ones: one every 3 s, a third
# of them notices, from 1 s after each part's cluster starts.
CHAOS = ["--preempt", "0.3", "--preempt-notices", "0.3", "--preempt-grace", "1"]
CHAOS += ["--preempt-start", "1"]
KILLED_ATTEMPTS = 3
GRACE = 1.0

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.alone, pytest.mark.timeout(600)]


def killed(attempts: list[Attempt]) -> list[Attempt]:
    """Attempts whose worker was killed (not those lost with the killed driver)."""
    return [
        a for a in attempts if a.state == "killed" and "previous driver" not in (a.reason or "")
    ]


def merged_resumers(attempts: list[Attempt]) -> list[Attempt]:
    """Merged attempts that started from a killed attempt's checkpoint."""
    by_id = {a.id: a for a in attempts}
    return [
        a
        for a in attempts
        if a.state == "merged" and a.resumed_from and by_id[a.resumed_from].samples
    ]


def merged_partials(attempts: list[Attempt]) -> list[Attempt]:
    """Merged partial results of attempts stopped by a preemption notice."""
    return [a for a in attempts if a.state == "merged" and "preemption notice" in (a.reason or "")]


def eventful(attempts: list[Attempt]) -> bool:
    """The ledger has every kind of event the test is about."""
    return (
        len(killed(attempts)) >= KILLED_ATTEMPTS
        and bool(merged_resumers(attempts))
        and bool(merged_partials(attempts))
    )


def worker_pid(group: int, address: str) -> int | None:
    """The pid of the process of ``group`` listening at the Dask worker ``address``'s port."""
    port = int(address.rsplit(":", 1)[1])
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) == group and any(
                c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                for c in proc.net_connections("tcp")
            ):
                return proc.pid
    return None


def aim_events(driver: Popen[bytes], home: Path, timeout: float) -> dict[str, int]:
    """Kill and notice workers of running attempts until the run is eventful and an epoch is
    complete; what was sent. Fails if the driver ends first."""
    db, url = home / "ledger.db", f"sqlite:///{home / 'ledger.db'}"
    sent = {"kill": 0, "notice": 0}
    aimed: set[str] = set()  # attempts whose worker was signalled
    ending: dict[int, float] = {}  # pid under notice -> when its grace ends
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert driver.poll() is None, f"{log_tail(home, 'train')}\naimed: {sent}"
        for pid, at in list(ending.items()):
            if time.monotonic() >= at:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                del ending[pid]
        ledger = Ledger(url) if db.exists() else None
        run = ledger.find_run("chaos") if ledger else None
        if ledger is None or run is None:
            time.sleep(0.2)
            continue
        attempts = ledger.attempts("chaos")
        if run.epochs_completed >= 1 and eventful(attempts):
            return sent
        kind = (
            "kill"
            if len(killed(attempts)) < KILLED_ATTEMPTS
            else "notice"
            if not merged_partials(attempts)
            and not ending
            and not any(a.state == "interrupted" for a in attempts)
            else None
        )
        targets = [
            a
            for a in attempts
            if a.state == "running" and a.checkpoint_uri and a.samples and a.id not in aimed
        ]
        if kind and targets:
            victim = worker_pid(driver.pid, targets[0].worker)
            if victim is not None:
                aimed.add(targets[0].id)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL if kind == "kill" else signal.SIGTERM)
                    sent[kind] += 1
                    if kind == "notice":
                        ending[victim] = time.monotonic() + GRACE
        time.sleep(0.1)
    pytest.fail(
        f"no eventful run within {timeout:.0f} s (aimed: {sent}):\n{log_tail(home, 'train')}"
    )


def test_a_chaos_run_with_a_killed_driver_replays_bit_for_bit(
    prefect_api_url: str, tmp_path: Path
) -> None:
    began = time.monotonic()
    home = tmp_path / "home"
    log = home / "chaos.jsonl"
    env = {"PREFECT_API_URL": prefect_api_url}
    sets = [arg for s in SMALL for arg in ("--set", s)]
    driver = start_vcdl(
        home, "train", str(EXAMPLE), "--run", "chaos", *sets, *CHAOS, "--preempt-seed", "1",
        "--preempt-log", str(log), env=env,
    )  # fmt: skip
    try:
        aimed = aim_events(driver, home, timeout=400)
        driver.send_signal(signal.SIGKILL)  # the driver dies mid-run, no cleanup
        driver.wait(30)
    finally:
        reap(driver)
    first_part = time.monotonic() - began
    ledger = Ledger(f"sqlite:///{home / 'ledger.db'}")
    killed_at = ledger.get_run("chaos")
    assert killed_at.state == "running", "the run ended before the driver was killed"
    assert killed_at.epochs_completed < EPOCHS

    resumed = start_vcdl(
        home, "resume", "chaos", *CHAOS, "--preempt-seed", "2", "--preempt-log", str(log),
        env=env,
    )  # fmt: skip
    try:
        resumed.wait(timeout=300)
    finally:
        reap(resumed)
    assert resumed.returncode == 0, log_tail(home, "resume")
    trained = time.monotonic() - began

    run = ledger.get_run("chaos")
    assert run.state == "completed" and run.epochs_completed == EPOCHS
    assert run.lease_generation >= 2  # a second driver took the run over
    attempts = ledger.attempts("chaos")
    resumers = merged_resumers(attempts)
    summary = {
        "aimed": aimed,
        "simulator_sent": sent_counts(log),
        "attempts": len(attempts),
        "killed": len(killed(attempts)),
        "lost_with_driver": sum("previous driver" in (a.reason or "") for a in attempts),
        "merged_resumers": len(resumers),
        "merged_partials": len(merged_partials(attempts)),
        "driver_killed_after_epochs": killed_at.epochs_completed,
        "head": run.head_version,
        "first_part_s": round(first_part, 1),
        "trained_s": round(trained, 1),
    }
    print("chaos run:", json.dumps(summary))
    assert eventful(attempts), summary

    t = time.monotonic()
    replay = subprocess.run(
        [sys.executable, "-m", "vcdl.cli", "replay", "chaos", "--json", "--home", str(home)],
        env=dict(
            os.environ, PREFECT_HOME=str(prefecthome.seed(home / "prefect")), VCDL_HOME=str(home)
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    replayed = time.monotonic() - t
    assert replay.returncode == 0, replay.stderr[-3000:]
    doc = json.loads(replay.stdout)
    print(
        f"replay: {doc['versions']} versions, {doc['trainings']} trainings in "
        f"{doc['seconds']:.1f} s ({replayed:.1f} s with the command's start)"
    )
    assert doc["bit_for_bit"] is True and doc["divergence"] is None, doc
    head = run.head_version
    assert head == EPOCHS * 4
    assert (doc["first"], doc["last"], doc["versions"], doc["compared"]) == (0, head, head, head)
    # Every merged attempt was re-trained, and the killed ones whose checkpoints they resumed.
    assert doc["trainings"] >= head + len({a.resumed_from for a in resumers})
    assert doc["devices"] == ["cpu"]
