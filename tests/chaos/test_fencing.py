"""A driver paused past its lease (SIGSTOP) while another resumes the run, then continued.

Each trial: ``vcdl train`` (driver A) runs until the head reaches a random
version; A is SIGSTOPped (its workers go on); once its lease has expired
and a random while more has passed, ``vcdl resume`` (driver B) takes the
run over; once B has merged a random number of versions, A is continued.
Then:

* A stops: it exits non-zero within a renewal interval and a poll of its
  epoch loop (plus its cluster's shutdown), naming the driver that took over;
* nothing A did after waking reached the ledger: no version of A's lease
  generation was created after A was continued;
* B finishes the run, which audits clean (deep: every kept version's bytes
  against its checksums) with every subtask merged exactly once.

Before fencing, one trial in three tore the head and two made duplicates
(vcdl/ledger/fence.py). The trials' random points are drawn from a seed the
test prints, new each session, so a failure can be replayed.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from benchmarks.cli_proc import log_tail, reap, start_vcdl
from tests.driverwait import wait_for_run
from vcdl import api
from vcdl.ledger import Ledger
from vcdl.store.paths import group_generation
from vcdl.views.audit import audit_run

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.timeout(900), pytest.mark.alone]

TTL = 4.0  # the drivers' lease (VCDL_LEASE_TTL): renewed every TTL/3 s
EPOCHS = 4
CONFIG = f"""
[run]
name = "fence"
epochs = {EPOCHS}
seed = 5

[data]
name = "mnist1d"
samples = 4000
shards = 6

[model]
factory = "cnn1d"
kwargs = {{ width = 16 }}

[train]
local_epochs = 2

[cluster]
workers = 2
"""


def stop_outside_a_write(pid: int, db: Path) -> None:
    """SIGSTOP ``pid`` at a moment it holds no write transaction on the SQLite ledger ``db``.

    A process stopped inside one keeps SQLite's write lock for as long as it is
    stopped, and no other process can write: the resuming driver waits, then
    fails with "stayed locked for 30 s" (it did once), and this test, which
    continues A only after B has taken over, would wait for nothing. That is
    SQLite's locking, not the lease's fencing this test is about
    (docs/fault-tolerance.md says what it means for a paused driver).
    """
    for _ in range(200):
        os.kill(pid, signal.SIGSTOP)
        probe = sqlite3.connect(db, timeout=0)
        try:
            probe.execute("BEGIN IMMEDIATE")  # takes the write lock only if it is free
            probe.execute("ROLLBACK")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                raise
        finally:
            probe.close()
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError("driver A held the ledger's write lock at 200 tries to stop it")


def trial(tmp_path: Path, prefect_api_url: str, rng: random.Random) -> None:
    home = tmp_path / "home"
    cfg = tmp_path / "fence.toml"
    cfg.write_text(CONFIG)
    env = {"PREFECT_API_URL": prefect_api_url, "VCDL_LEASE_TTL": str(TTL)}
    db = home / "ledger.db"
    pause_at = rng.randint(1, 2 * 6)  # a head version in the first two epochs
    extra = rng.uniform(0.0, 6.0)  # how long past the lease A stays paused
    b_merges = rng.randint(0, 4)  # versions B merges before A wakes
    print(f"pause A at v{pause_at}, {extra:.1f} s past its lease; B merges {b_merges} first")

    a = start_vcdl(home, "train", str(cfg), env=env)
    b = None
    try:
        wait_for_run(
            a,
            db,
            "fence",
            lambda run: run.head_version >= pause_at,
            timeout=300,
            tail=lambda: log_tail(home, "train"),
            poll=0.2,
        )
        stop_outside_a_write(a.pid, db)
        ledger = Ledger(f"sqlite:///{db}")
        a_run = ledger.get_run("fence")
        a_gen, a_owner = a_run.lease_generation, a_run.lease_owner
        time.sleep(TTL + 0.5 + extra)
        b = start_vcdl(home, "resume", "fence", env=env)
        taken = wait_for_run(
            b,
            db,
            "fence",
            lambda run: run.lease_generation > a_gen,
            timeout=120,
            tail=lambda: log_tail(home, "resume"),
            poll=0.2,
        )
        if b_merges:
            wait_for_run(
                b,
                db,
                "fence",
                lambda run: (
                    run.head_version >= taken.head_version + b_merges or run.state == "completed"
                ),
                timeout=300,
                tail=lambda: log_tail(home, "resume"),
                poll=0.2,
            )
        woke = time.time()
        os.kill(a.pid, signal.SIGCONT)
        a.wait(timeout=60)
        a_exit_after = time.time() - woke
        b.wait(timeout=600)
    finally:
        reap(a)
        if b is not None:
            reap(b)
    a_log, b_log = log_tail(home, "train", 6000), log_tail(home, "resume", 6000)
    print(f"A exited {a.returncode} {a_exit_after:.1f} s after it was continued")
    assert b.returncode == 0, b_log
    assert a.returncode != 0, a_log
    b_owner = ledger.get_run("fence").lease_owner  # None: B let it go at its end
    assert b_owner is None and taken.lease_owner is not None
    if "was taken over by driver" in a_log:
        assert taken.lease_owner in a_log, a_log  # it names the driver that took over
    else:
        # B finished and let the lease go before A looked (a slow machine, a
        # late pause): A cannot name a holder that no longer exists.
        assert "was taken over by another driver (which has since let it go)" in a_log, a_log
    assert taken.lease_owner != a_owner
    # A stops within a renewal interval and a poll, plus its cluster's shutdown.
    assert a_exit_after < 45, a_log

    # Nothing A did after it woke reached the ledger.
    late = [
        v.number
        for v in ledger.versions("fence")
        if v.created_at.timestamp() > woke and group_generation(v.uri.rsplit("/", 1)[-1]) == a_gen
    ]
    assert late == [], late

    status = api.status("fence", home=home)
    assert status["state"] == "completed" and status["epochs_completed"] == EPOCHS
    ref = api.run_ref("fence", home=home)
    assert audit_run(ref, deep=True) == []
    merged = [v.subtask_id for v in ledger.versions("fence") if v.subtask_id is not None]
    assert len(merged) == len(set(merged)) == EPOCHS * 6


# A new set of random points every session (one trial, about 40 s: CI's time is
# short), so that runs of the suite together cover many more than any one does;
# the set is printed and VCDL_FENCE_SEED replays it (VCDL_FENCE_TRIALS: more trials).
SET = int(os.environ.get("VCDL_FENCE_SEED") or random.SystemRandom().randrange(1_000_000))
TRIALS = int(os.environ.get("VCDL_FENCE_TRIALS", "1"))


@pytest.mark.parametrize("seed", range(TRIALS))
def test_a_driver_paused_past_its_lease_stops_and_the_run_survives(
    tmp_path: Path, prefect_api_url: str, seed: int
) -> None:
    drawn = SET * 1000 + seed
    print(f"seed {drawn} (VCDL_FENCE_SEED={SET} replays this set)")
    trial(tmp_path, prefect_api_url, random.Random(drawn))
