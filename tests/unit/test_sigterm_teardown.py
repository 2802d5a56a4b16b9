"""tests/sigterm.py: a SIGTERM to pytest still runs the session's finalizers."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_sigterm_runs_session_finalizers(tmp_path: Path) -> None:
    ready, torn_down = tmp_path / "ready", tmp_path / "torn-down"
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_held.py").write_text(
        textwrap.dedent(
            f"""
            import pathlib, time
            import pytest

            @pytest.fixture(scope="session")
            def server():
                yield  # a server in its own process group, in the real fixtures
                pathlib.Path({str(torn_down)!r}).write_text("finalized")

            def test_long(server):
                pathlib.Path({str(ready)!r}).write_text("running")
                time.sleep(60)
            """
        )
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.sigterm",
            "-c",
            str(tmp_path / "pytest.ini"),
            str(tmp_path / "test_held.py"),
        ],
        cwd=REPO,  # `tests.sigterm` importable
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the inner test never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert torn_down.read_text() == "finalized", out
    assert proc.returncode == 2, out  # pytest's "interrupted"
    # pytest's interrupted banner, naming the CLI's KeyboardInterrupt for SIGTERM.
    assert "!!! vcdl.termination.Terminated !!!" in out, out
