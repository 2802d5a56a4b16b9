"""SIGTERM to `vcdl train` (a spot notice on the driver's machine, `docker stop`,
`systemctl stop`): the run winds down as after Ctrl-C and leaves no process behind.

Before, SIGTERM ended the driver at once: it printed nothing, and the Prefect
API server it had started for itself (a child process) went on running with
nobody to stop it. The run is the README's digits example, terminated once
its first version is merged, then resumed to the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.driverwait import wait_for_run
from vcdl.ledger import Ledger

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _cli(home: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "vcdl.cli", *args, "--home", str(home)]


def test_sigterm_stops_the_driver_like_ctrl_c_and_leaves_no_process(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = dict(
        os.environ,
        PREFECT_HOME=str(home / "prefect"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
    )
    # The run's own temporary Prefect API server: no PREFECT_API_URL.
    env.pop("PREFECT_API_URL", None)
    home.mkdir()
    err = home / "train.err"
    with open(err, "wb") as stderr:
        driver = subprocess.Popen(
            _cli(home, "train", str(REPO / "examples" / "digits.toml"), "--run", "term"),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,  # so that the test can reap whatever is left
        )
    ledger_url = f"sqlite:///{home / 'ledger.db'}"
    children: list[psutil.Process] = []
    try:
        wait_for_run(
            driver,
            home / "ledger.db",
            "term",
            lambda run: run.head_version >= 1,
            timeout=240,
            tail=lambda: err.read_text()[-3000:],
        )
        children = psutil.Process(driver.pid).children(recursive=True)
        # The API server and the Dask cluster's processes: what was left behind.
        assert len(children) >= 2, children
        driver.send_signal(signal.SIGTERM)
        code = driver.wait(120)
        message = err.read_text()
        assert code == 143, message[-3000:]
        last = message.strip().splitlines()[-1]
        assert last == (
            "vcdl: error: terminated (SIGTERM); `vcdl resume RUN` continues from the ledger"
        ), message[-3000:]
        _, alive = psutil.wait_procs(children, timeout=30)
        assert alive == [], [(p.pid, p.cmdline()) for p in alive]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
        for p in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
    # Not left "running", and the lease given back: a resume need not wait it out.
    run = Ledger(ledger_url).get_run("term")
    assert run.state == "failed" and run.epochs_completed < 15, run
    assert run.lease_owner is None, run

    resumed = subprocess.run(
        _cli(home, "resume", "term"), env=env, capture_output=True, text=True, timeout=400
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    run = Ledger(ledger_url).get_run("term")
    assert run.state == "completed" and run.epochs_completed == 15, run
