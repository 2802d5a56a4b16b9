"""What `vcdl train` shows: a live display in a terminal, plain lines in a pipe, the log in a file.

The terminal is a pseudo-terminal of 100 × 30; the run is small (digits, 2
epochs × 3 shards, 2 workers) and most of its time is Prefect's and the
cluster's start.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from benchmarks.cli_proc import kill_group
from tests import prefecthome

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.alone]

CONFIG = """
[run]
name = "term"
epochs = {epochs}
[data]
name = "digits"
shards = 3
[model]
factory = "cnn2d"
kwargs = {{ width = 8 }}
[cluster]
workers = 2
"""
ESCAPE = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|.)")
PREFECT_INFO = re.compile(r"\|\s*INFO\s*\|")


def _setup(
    tmp_path: Path, epochs: int, api_url: str | None = None
) -> tuple[list[str], dict[str, str], Path]:
    home = tmp_path / "home"
    cfg = tmp_path / "term.toml"
    cfg.write_text(CONFIG.format(epochs=epochs))
    env = dict(
        os.environ,
        PREFECT_HOME=str(prefecthome.seed(home / "prefect")),
        VCDL_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        COLUMNS="100",
        LINES="30",
        TERM="xterm-256color",
    )
    env.pop("NO_COLOR", None)
    if api_url is not None:
        env["PREFECT_API_URL"] = api_url
    argv = [sys.executable, "-m", "vcdl.cli", "train", str(cfg), "--home", str(home)]
    return argv, env, home


def _in_a_terminal(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int, bytes]:
    """Run ``argv`` with a pseudo-terminal as stdin, stdout and stderr; (exit code, bytes)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    proc = subprocess.Popen(
        argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
    )
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer of the terminal has closed it
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        code = proc.wait(30)
    finally:
        kill_group(proc.pid)
        os.close(master)
    return code, bytes(out)


def test_a_terminal_gets_a_live_display_and_the_log_goes_to_a_file(tmp_path: Path) -> None:
    argv, env, home = _setup(tmp_path, epochs=2)
    started = time.monotonic()
    code, raw = _in_a_terminal(argv, env, timeout=240)
    seconds = time.monotonic() - started
    screen = raw.decode("utf-8", "replace")
    text = ESCAPE.sub("", screen)
    assert code == 0, text[-3000:]
    print(f"pty run: {seconds:.1f} s, {len(raw)} bytes to the terminal")
    # Without -v no Prefect line reaches the screen...
    assert not PREFECT_INFO.search(text), [ln for ln in text.splitlines() if "INFO" in ln][:5]
    assert "Finished in state" not in text and "temporary server" not in text
    # ...the log file has them, the driver's and the workers' (task runs), and says where.
    log = home / "logs" / "term.log"
    assert f"vcdl: log in {log}" in text
    logged = log.read_text()
    assert PREFECT_INFO.search(logged) and "Flow run" in logged, logged[-2000:]
    assert "Task run 'epoch 1 · shard" in logged and "Starting temporary server" in logged
    # The display is live: it redraws in place (rich's cursor moves), many distinct renders.
    assert "\x1b[1A" in screen and "\x1b[2K" in screen
    renders = set(re.findall(r"epoch (\d)/2 \S* (\d)/3 shards · head v(\d+)", text))
    assert len(renders) >= 3, renders
    assert ("2", "3", "6") in renders  # the last: every shard of epoch 2, head v6
    clocks = set(re.findall(r"(\d+)s elapsed", text))
    assert len(clocks) >= 5, clocks
    assert re.search(r"test accuracy 0\.\d{4}, loss [\d.]+ \(epoch 1\)", text)
    # The summary after it, fitted to the terminal's 100 columns.
    after = text[text.index("run term: completed") :]
    assert max(len(line) for line in after.splitlines()) <= 100
    assert "per merged attempt, mean seconds:" in after


def test_piped_output_is_plain_lines(tmp_path: Path, prefect_api_url: str) -> None:
    """Piped, with -v: progress lines and Prefect's, no escape sequence or carriage return."""
    argv, env, home = _setup(tmp_path, epochs=1, api_url=prefect_api_url)
    started = time.monotonic()
    out = subprocess.run(
        [*argv, "-v"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240
    )
    print(f"piped run: {time.monotonic() - started:.1f} s")
    text = out.stdout.decode("utf-8", "replace")
    assert out.returncode == 0, text[-3000:]
    assert "\x1b" not in text and "\r" not in text, [ln for ln in text.splitlines() if "\x1b" in ln]
    progress = [ln for ln in text.splitlines() if re.match(r"epoch 1/1 · shards \d/3 · head v", ln)]
    assert progress and progress[-1].startswith("epoch 1/1 · shards 3/3 · head v3"), text[-3000:]
    assert "elapsed" in progress[-1]
    # -v shows the log's lines here too; they are in the file as well.
    assert PREFECT_INFO.search(text) and "Finished in state Completed()" in text
    assert "Finished in state Completed()" in (home / "logs" / "term.log").read_text()
    assert "run term: completed" in text
