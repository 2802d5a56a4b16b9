"""SIGTERM inside :func:`sigterm_as_interrupt` is an interrupt the CLI can report (exit 143)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from vcdl.cli import main
from vcdl.termination import TERMINATED_EXIT, Terminated, sigterm_as_interrupt


def test_sigterm_raises_terminated_and_the_previous_handler_comes_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated), sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs at the next bytecode: never reached
    assert signal.getsignal(signal.SIGTERM) is before
    assert issubclass(Terminated, KeyboardInterrupt)  # wound down wherever Ctrl-C is


def test_outside_the_main_thread_nothing_changes() -> None:
    seen: list[object] = []

    def run() -> None:
        with sigterm_as_interrupt():
            seen.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == [before]


def test_the_cli_says_terminated_and_exits_143(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def dispatch(args: object) -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        return 0

    monkeypatch.setattr("vcdl.cli._dispatch", dispatch)
    with pytest.raises(SystemExit) as exit_:
        main(["resume", "some-run"])
    assert exit_.value.code == TERMINATED_EXIT == 143
    err = capsys.readouterr().err
    assert err == (
        "vcdl: error: terminated (SIGTERM); `vcdl resume some-run` continues from the ledger\n"
    )
    # A command with no run to resume says only what happened.
    with pytest.raises(SystemExit) as exit_:
        main(["runs", "--json"])
    assert exit_.value.code == 143
    doc = json.loads(capsys.readouterr().err)
    assert doc["error"]["type"] == "Terminated"
    assert doc["error"]["message"] == "terminated (SIGTERM)"
