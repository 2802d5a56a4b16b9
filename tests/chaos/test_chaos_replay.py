"""Issue 53's acceptance: a run under chaos replays bit for bit (``vcdl replay RUN --json``).

A small form of the chaos recipe of ``tests/chaos/test_chaos_run.py``: a
``vcdl train --preempt …`` subprocess of ``examples/mnist1d.toml`` (fewer
samples and epochs, a narrower model) whose workers the preemption simulator
SIGKILLs and notices, with checkpoints every 0.1 s so that a killed attempt
leaves one to resume. Once the ledger shows what the test is about (killed
attempts, a merged attempt that resumed a killed one's checkpoint, a merged
partial result of a notice) and an epoch is complete, the driver is
SIGKILLed and ``vcdl resume`` finishes the run. Then ``vcdl replay RUN
--json``, as a user runs it, must re-make every version bit for bit.

The driver is killed when the events are there, not after a fixed epoch: how
many land depends on the machine's speed (the schedule is seeded, its effect
is not), and waiting for them keeps the test from passing on a run without
them while the run lasts no longer than it needs. The resume runs without the
simulator: the events are in the ledger by then, and it is the short part.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.cli_proc import log_tail, reap, start_vcdl
from tests.driverwait import wait_for_run
from vcdl.chaos import sent_counts
from vcdl.ledger import Attempt, Ledger, Run

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "mnist1d.toml"

EPOCHS = 4
# Attempts of ~1.5 s of training (8 local epochs of a 1600-row shard) that
# checkpoint every 0.1 s: a kill mid-attempt usually leaves a checkpoint for the
# replacement, and the workers spend most of their time in attempts, where a
# kill or a notice does something (with 4 local epochs, 6 kills sent made 2
# killed attempts in one run).
SMALL = [
    f"run.epochs={EPOCHS}",
    "data.samples=8000",
    "data.shards=4",
    "model.kwargs.width=16",
    "train.local_epochs=8",
    "fault.checkpoint_seconds=0.1",
]
# One event a second from 1 s after the cluster starts, 40 % of them notices
# (at two a second the workers spent most of the run restarting: 18 kills
# made 3 killed attempts and the run took twice as long).
CHAOS = ["--preempt", "1.0", "--preempt-notices", "0.4", "--preempt-grace", "1"]
CHAOS += ["--preempt-start", "1", "--preempt-seed", "1"]
KILLED_ATTEMPTS = 3

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


def eventful(ledger: Ledger, run: Run) -> bool:
    """An epoch is complete and the ledger has every kind of event the test needs."""
    if run.epochs_completed < 1:
        return False
    attempts = ledger.attempts(run.name)
    return (
        len(killed(attempts)) >= KILLED_ATTEMPTS
        and bool(merged_resumers(attempts))
        and bool(merged_partials(attempts))
    )


def test_a_chaos_run_with_a_killed_driver_replays_bit_for_bit(
    prefect_api_url: str, tmp_path: Path
) -> None:
    began = time.monotonic()
    home = tmp_path / "home"
    db = home / "ledger.db"
    url = f"sqlite:///{db}"
    log = home / "chaos.jsonl"
    env = {"PREFECT_API_URL": prefect_api_url}
    sets = [arg for s in SMALL for arg in ("--set", s)]
    driver = start_vcdl(
        home, "train", str(EXAMPLE), "--run", "chaos", *sets, *CHAOS, "--preempt-log", str(log),
        env=env,
    )  # fmt: skip
    try:
        wait_for_run(
            driver,
            db,
            "chaos",
            lambda run: eventful(Ledger(url), run),
            timeout=400,
            tail=lambda: log_tail(home, "train") + f"\nchaos: {sent_counts(log)}",
            poll=0.25,
        )
        driver.send_signal(signal.SIGKILL)  # the driver dies mid-run, no cleanup
        driver.wait(30)
    finally:
        reap(driver)
    first_part = time.monotonic() - began
    ledger = Ledger(url)
    killed_at = ledger.get_run("chaos")
    assert killed_at.state == "running", "the run ended before the driver was killed"
    assert killed_at.epochs_completed < EPOCHS

    resumed = start_vcdl(home, "resume", "chaos", env=env)
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
    counts = sent_counts(log)
    summary = {
        "sent": counts,
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
    assert counts["kill"] >= KILLED_ATTEMPTS and counts["notice"] >= 1, summary
    assert eventful(ledger, run), summary

    t = time.monotonic()
    replay = subprocess.run(
        [sys.executable, "-m", "vcdl.cli", "replay", "chaos", "--json", "--home", str(home)],
        env=dict(os.environ, PREFECT_HOME=str(home / "prefect"), VCDL_HOME=str(home)),
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
