"""A `vcdl train` whose stdout and stderr nobody reads still finishes its run.

The CLI's output goes to a pipe of 4 KiB that the test leaves unread until the
ledger says the run is over. `--verbose` logs every task run, so the pipe is
full within the first epoch. Before vcdl.console, the first log write past
that point blocked its thread; when that thread was the driver's Dask IO loop,
no result reached the driver any more (the chaos test stalled in CI this way).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks.cli_proc import kill_group
from vcdl.ledger import Ledger

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.alone]

CONFIG = """
[run]
name = "blocked"
seed = 0
epochs = 3

[data]
name = "mnist1d"
samples = 4000
shards = 6

[model]
factory = "cnn1d"
kwargs = { width = 16 }

[cluster]
workers = 2
"""


def _drain(fd: int, into: list[bytes]) -> None:
    with os.fdopen(fd, "rb", buffering=0) as f:
        while chunk := f.read(65536):
            into.append(chunk)


def test_a_console_nobody_reads_does_not_stall_the_run(
    tmp_path: Path, prefect_api_url: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    config = tmp_path / "blocked.toml"
    config.write_text(CONFIG)
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
    env = dict(
        os.environ,
        PREFECT_HOME=str(home / "prefect"),
        VCDL_HOME=str(home),
        PREFECT_API_URL=prefect_api_url,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "vcdl.cli", "train", str(config), "--verbose", "--home", str(home)],
        env=env,
        stdout=w,
        stderr=w,
        start_new_session=True,
    )
    os.close(w)
    ledger_url = f"sqlite:///{home / 'ledger.db'}"
    state = None
    deadline = time.monotonic() + 420
    try:
        # Nobody reads the pipe while the run trains.
        while time.monotonic() < deadline and proc.poll() is None:
            if (home / "ledger.db").exists():
                with contextlib.suppress(Exception):  # a half-created ledger
                    run = Ledger(ledger_url).find_run("blocked")
                    state = run.state if run is not None else None
                if state in ("completed", "failed"):
                    break
            time.sleep(1)
        output: list[bytes] = []
        reader = threading.Thread(target=_drain, args=(r, output), daemon=True)
        reader.start()
        code = proc.wait(120)
        reader.join(10)
    finally:
        kill_group(proc.pid)
    text = b"".join(output).decode(errors="replace")
    assert state == "completed", f"run state {state!r} with the console unread:\n{text[-3000:]}"
    assert code == 0, text[-3000:]
    # The console did get the output once it was read (what fit, and the summary).
    assert "run blocked: completed" in text
