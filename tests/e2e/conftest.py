"""A real ``prefect server`` subprocess, its work pool, deployments and worker.

Every subprocess runs in its own process group and is killed at teardown.
When the server cannot start the tests skip with the reason, and fail under
``CI=true``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import prefecthome
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).with_name("prefect"))
IN_CI = os.environ.get("CI", "").lower() == "true"


def unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(reason)
    pytest.skip(reason)


@dataclass
class Server:
    url: str  # http://127.0.0.1:PORT
    env: dict[str, str]
    tmp: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"

    def spawn(
        self, args: list[str], log: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        out = open(self.tmp / log, "wb")  # noqa: SIM115  (closed with the process)
        p = subprocess.Popen(
            args,
            cwd=REPO,
            env=self.env | (env or {}),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(p)
        return p

    def run(self, args: list[str], timeout: float = 120) -> str:
        r = subprocess.run(
            args, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if r.returncode != 0:
            raise AssertionError(f"{args} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        return r.stdout

    def log(self, name: str) -> str:
        path = self.tmp / name
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


def kill_group(p: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process's group, then SIGKILL whatever is left of it (flow runs, Dask)."""
    try:
        pgid = os.getpgid(p.pid)
    except ProcessLookupError:
        pgid = p.pid  # leader gone; its group id is still its pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        if sig == signal.SIGTERM:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(5)


def wait_healthy(server: Server, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{server.api_url}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "VCDL_"))}
    env |= {
        "PREFECT_HOME": str(prefecthome.seed(tmp / "prefect-home")),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOCAL_STORAGE_PATH": str(tmp / "results"),
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_WORKER_PREFETCH_SECONDS": "5",
        "PYTHONUNBUFFERED": "1",
    }
    # `--port` does not reach the UI's idea of where the API is: without this
    # the browser app calls 127.0.0.1:4200 and shows "Can't connect".
    env["PREFECT_UI_API_URL"] = f"http://127.0.0.1:{port}/api"
    server = Server(url=f"http://127.0.0.1:{port}", env=env, tmp=tmp)
    proc = server.spawn(
        [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)], "server.log"
    )
    try:
        if not wait_healthy(server, proc, 120):
            unavailable(f"prefect server did not become healthy:\n{server.log('server.log')}")
        server.env = env | {"PREFECT_API_URL": server.api_url}
        yield server
    finally:
        for p in reversed(server.procs):
            kill_group(p)
