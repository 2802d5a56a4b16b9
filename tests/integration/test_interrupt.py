"""A run stopped the three ways machines and people stop it, then resumed to its end.

- **Ctrl-C in a terminal**: SIGINT to the driver's whole process group. Before,
  it killed Prefect's temporary API server (the driver's child) at the same
  instant; the driver, winding down, retried every Prefect call against the
  closed port and was still running, silent, 4.5 minutes later.
- **SIGTERM to the driver** (a spot notice on the driver's machine, ``docker
  stop``, a deleted pod). Before, the driver died at once, printed nothing, and
  left the API server running with nobody to stop it.
- **SIGTERM to every process at once** (``systemctl stop``: systemd's default
  ``KillMode=control-group``). Before, the API server died first and the
  driver hung as after Ctrl-C, until systemd's SIGKILL left the run holding its
  lease.

Each time: the command says what happened in one line and exits 130 or 143
within a minute, no process of the run is left, the run is ``failed`` with
its lease given back; ``vcdl resume`` then completes the run. The run is the
README's digits example, cut to 5 epochs. Plus the API server's own guarantees
(:mod:`flows.workarounds.api_server`), with a driver killed outright.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from benchmarks.cli_proc import kill_group
from tests import prefecthome
from tests.driverwait import wait_for_run
from vcdl.ledger import Ledger, Run

REPO = Path(__file__).resolve().parents[2]
HINT = "; `vcdl resume stops` continues from the ledger"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.alone]


def _cli(home: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "vcdl.cli", *args, "--home", str(home)]


def _env(home: Path) -> dict[str, str]:
    env = dict(
        os.environ,
        PREFECT_HOME=str(prefecthome.seed(home / "prefect")),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
    )
    # The run's own temporary Prefect API server: no PREFECT_API_URL.
    env.pop("PREFECT_API_URL", None)
    return env


def _merged_since(head: int, run: Run) -> bool:
    return run.state == "running" and run.head_version > head


def _tail(path: Path) -> str:
    return path.read_text()[-3000:]


def _reap(group: int, processes: list[psutil.Process]) -> None:
    """Whatever a failed test left: the driver's process group, and processes outside it."""
    kill_group(group)
    for p in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _ctrl_c(driver: psutil.Process, children: list[psutil.Process]) -> None:
    os.killpg(driver.pid, signal.SIGINT)  # what a terminal does


def _sigterm_driver(driver: psutil.Process, children: list[psutil.Process]) -> None:
    driver.send_signal(signal.SIGTERM)


def _sigterm_everyone(driver: psutil.Process, children: list[psutil.Process]) -> None:
    for p in [driver, *children]:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGTERM)


STOPS: list[tuple[str, Callable[[psutil.Process, list[psutil.Process]], None], int, str]] = [
    ("Ctrl-C", _ctrl_c, 130, f"vcdl: error: interrupted{HINT}"),
    ("SIGTERM to the driver", _sigterm_driver, 143, f"vcdl: error: terminated (SIGTERM){HINT}"),
    ("SIGTERM to all", _sigterm_everyone, 143, f"vcdl: error: terminated (SIGTERM){HINT}"),
]


def test_a_run_stopped_three_ways_winds_down_in_seconds_and_resumes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = _env(home)
    db = home / "ledger.db"
    ledger = Ledger(f"sqlite:///{db}")
    head = 0
    for i, (how, stop, code, line) in enumerate(STOPS):
        argv = (
            [
                "train",
                str(REPO / "examples" / "digits.toml"),
                "--run",
                "stops",
                "--set",
                "run.epochs=5",
            ]
            if i == 0
            else ["resume", "stops"]
        )
        err = home / f"driver-{i}.err"
        with open(err, "wb") as stderr:
            driver = subprocess.Popen(
                _cli(home, *argv),
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,  # its own group, as a terminal's foreground job
                # As a terminal's job gets it: a suite started in the background by a
                # shell without job control inherits SIGINT ignored, and so would the driver.
                preexec_fn=_sigint_default,
            )
        children: list[psutil.Process] = []
        try:
            # Stopped once it has merged something new: mid-epoch, workers busy.
            wait_for_run(
                driver,
                db,
                "stops",
                functools.partial(_merged_since, head),
                timeout=300,
                tail=functools.partial(_tail, err),
            )
            process = psutil.Process(driver.pid)
            children = process.children(recursive=True)
            # The API server and the Dask cluster's processes.
            assert len(children) >= 2, children
            stop(process, children)
            started = time.monotonic()
            returned = driver.wait(120)
            seconds = time.monotonic() - started
            print(f"{how}: exit {returned} in {seconds:.1f}s", flush=True)
            message = err.read_text()
            assert returned == code, (how, message[-3000:])
            assert message.strip().splitlines()[-1] == line, (how, message[-3000:])
            assert seconds < 60, (how, seconds)
            _, alive = psutil.wait_procs(children, timeout=30)
            assert alive == [], (how, [(p.pid, p.cmdline()) for p in alive])
        finally:
            _reap(driver.pid, children)
        # Not left "running", and the lease given back: a resume need not wait it out.
        run = ledger.get_run("stops")
        assert run.state == "interrupted" and run.epochs_completed < 5, (how, run)
        assert run.lease_owner is None, (how, run)
        head = run.head_version

    resumed = subprocess.run(
        _cli(home, "resume", "stops"), env=env, capture_output=True, text=True, timeout=400
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    run = ledger.get_run("stops")
    assert run.state == "completed" and run.epochs_completed == 5, run


# A driver that starts Prefect's temporary API server as vcdl does, then
# stops it and starts another when told to (a line on stdin), and waits.
_DRIVER = textwrap.dedent(
    """
    import sys
    from vcdl.api import prepare_prefect
    from pathlib import Path
    prepare_prefect(Path(sys.argv[1]))
    from prefect.server.api.server import SubprocessASGIServer
    while True:
        server = SubprocessASGIServer()
        server.start()
        print(server.server_process.pid, server.api_url, flush=True)
        sys.stdin.readline()
        server.stop()
        print("stopped", flush=True)
    """
)


def test_the_api_server_has_its_own_group_ignores_sigterm_and_dies_with_its_driver(
    tmp_path: Path,
) -> None:
    import httpx

    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, str(tmp_path)],
        env=_env(tmp_path),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert driver.stdin is not None and driver.stdout is not None
    servers: list[psutil.Process] = []
    try:
        pid, url = driver.stdout.readline().split()
        servers.append(psutil.Process(int(pid)))
        server = servers[-1]
        assert os.getpgid(server.pid) == server.pid != os.getpgid(driver.pid)
        # SIGTERM is for its driver, who stops it when done (systemd sends it to all).
        server.send_signal(signal.SIGTERM)
        time.sleep(2)
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        # Its driver still stops it at once: Prefect's stop would wait 5 s, then kill.
        started = time.monotonic()
        driver.stdin.write("stop\n")
        driver.stdin.flush()
        assert driver.stdout.readline().strip() == "stopped"
        assert time.monotonic() - started < 4.5
        assert not server.is_running()
        # Killed outright, the driver runs no exit handler: the server goes on its own.
        servers.append(psutil.Process(int(driver.stdout.readline().split()[0])))
        driver.kill()
        driver.wait(10)
        servers[-1].wait(30)
    finally:
        _reap(driver.pid, servers)
