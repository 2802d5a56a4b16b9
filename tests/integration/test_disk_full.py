"""Issue 54, item 7: a disk that fills up is one line saying what to do, exit 2, no traceback.

On a real full disk, not a mocked write: a tmpfs of 1 MiB mounted for the
test (root only; skipped where it cannot be mounted), so the machine's own
disk is never filled. An import that fills it, a run whose home has no room
for Prefect's database, a ledger SQLite cannot grow, (slow) a run whose
store fills up between versions, and a run whose log's disk (a tmpfs mounted
on ``<home>/logs``) is full when it starts, or fills while it trains (slow):
the run finishes, audits clean, and ends saying its log is cut short.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from vcdl.cli import main
from vcdl.diskfull import disk_full
from vcdl.errors import LedgerError

GOOD = """
[run]
epochs = 2
[data]
name = "digits"
shards = 2
[model]
factory = "cnn2d"
"""


def _mount(where: Path, size: str) -> None:
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip() or 'not root'})")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB file system of its own, unmounted after the test."""
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    where = tmp_path / "small"
    _mount(where, "1m")
    try:
        yield where
    finally:
        # Lazy: a child process the test started may still hold a file open.
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)


def _fill(disk: Path) -> None:
    """Take every byte the disk has left."""
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def _one_line(code: int, err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_an_import_that_fills_the_disk_is_one_line(
    small_disk: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: an OSError traceback from inside zarr's local store."""
    text = tmp_path / "big.txt"
    text.write_bytes(os.urandom(3 << 19))  # more than the disk holds, compressed or not
    argv = ["data", "import", str(text), "--name", "big", "--home", str(small_disk / "home")]
    code, _, err = _run(argv, capsys)
    line = _one_line(code, err)
    assert line.startswith("vcdl: error: the disk is full (no space left on device"), err
    assert "free space on it and run the command again" in line and "--home" in line, err
    # Nor is half a data set left taking the space (it was, before).
    datasets = small_disk / "home" / "store" / "datasets"
    assert not (datasets / "big").exists(), sorted(p.name for p in datasets.iterdir())
    code, out, err = _run([*argv, "--json"], capsys)
    assert code == 2 and out == "", out
    assert json.loads(err)["error"]["type"] == "DiskFull"


@pytest.mark.parametrize("command", ["train", "resume"])
def test_a_run_without_room_for_its_home_is_refused_at_once(
    command: str, small_disk: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: Prefect's temporary server failed to start on the full disk and the run
    ended 3 minutes later in a traceback ("Timed out while attempting to connect")."""
    cfg = tmp_path / "good.toml"
    cfg.write_text(GOOD)
    home = small_disk / "home"
    argv = ["train", str(cfg)] if command == "train" else ["resume", "good"]
    code, _, err = _run([*argv, "--home", str(home)], capsys)
    line = _one_line(code, err)
    assert f"the disk of {home} is full (" in line and "a run needs 32 MiB" in line, err
    assert "pass a --home (or $VCDL_HOME) on a disk with room" in line, err
    assert not home.exists()  # no data set made, no Prefect home, no log


def test_a_ledger_sqlite_cannot_grow_is_a_full_disk(small_disk: Path) -> None:
    from vcdl.ledger import Ledger

    _fill(small_disk)
    with pytest.raises(LedgerError) as caught:
        Ledger(f"sqlite:///{small_disk / 'ledger.db'}")
    assert disk_full(caught.value) is not None, caught.value


@pytest.mark.slow
def test_a_store_that_fills_during_a_run_is_one_line_naming_resume(
    small_disk: Path, tmp_path: Path
) -> None:
    """The store (store.url) on the small disk: the data set fits, the versions do not.
    Run as a user runs it, in a process of its own. Before: the run ended in a
    traceback of the store's OSError."""
    cfg = tmp_path / "good.toml"
    cfg.write_text(GOOD.replace("[run]", "[run]\nname = 'full'"))
    argv = ["train", str(cfg), "--home", str(tmp_path / "home"), "--workers", "1"]
    argv += ["--set", f"store.url={small_disk / 'store'}"]
    done = subprocess.run(
        [sys.executable, "-m", "vcdl.cli", *argv],
        capture_output=True,
        text=True,
        timeout=500,
        check=False,
    )
    err = done.stderr
    lines = [line for line in err.splitlines() if line.startswith("vcdl: error")]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("vcdl: error: the disk is full (no space left on device"), err
    assert "`vcdl resume full` continues the run" in lines[0], err


@pytest.fixture
def log_disk(tmp_path: Path) -> Iterator[Path]:
    """A home whose ``logs`` folder is a 1 MiB file system of its own, unmounted after."""
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    home = tmp_path / "home"
    home.mkdir()
    _mount(home / "logs", "1m")
    try:
        yield home
    finally:
        subprocess.run(["umount", "-l", str(home / "logs")], check=False, capture_output=True)


def test_a_run_whose_log_cannot_start_on_a_full_disk_is_one_line(
    log_disk: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The log's disk full before the run: exit 2 saying so, nothing of the run recorded."""
    _fill(log_disk / "logs")
    cfg = tmp_path / "good.toml"
    cfg.write_text(GOOD.replace("[run]", "[run]\nname = 'full'"))
    code, _, err = _run(["train", str(cfg), "--home", str(log_disk)], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) <= 3 and "Traceback" not in err, err
    assert lines[-1] == (
        f"vcdl: error: the run's log {log_disk / 'logs' / 'full.log'}: its disk is full (no "
        "space left on device); free space on it, or pass another --home"
    ), err
    assert not (log_disk / "ledger.db").exists()


# A whole run (70-100 s on a loaded machine) for what the log's own test below
# proves in a second; kept for --runlong, as an end-to-end check of it.
@pytest.mark.long
def test_a_run_whose_log_fills_mid_run_finishes_and_says_so(
    log_disk: Path, tmp_path: Path, prefect_api_url: str
) -> None:
    """A log with a kilobyte of room left (its last page's): Prefect's, Dask's and the
    workers' lines fill it early in the run. Before: the run finished, exit 0, the log
    silently cut short (nothing said where it ended). The run finishes, its ledger and
    store audit clean, and its last line on the terminal says the log was cut short."""
    log = log_disk / "logs" / "full.log"
    log.write_text("an earlier session's lines\n" * 110)  # 3 KB: 1 KB left in its page
    _fill(log_disk / "logs")
    cfg = tmp_path / "good.toml"
    cfg.write_text(
        GOOD.replace("[run]", "[run]\nname = 'full'").replace("epochs = 2", "epochs = 1")
    )
    env = dict(os.environ, PREFECT_API_URL=prefect_api_url, PREFECT_HOME=str(tmp_path / "p"))
    argv = [sys.executable, "-m", "vcdl.cli", "train", str(cfg), "--home", str(log_disk)]
    done = subprocess.run(
        [*argv, "--workers", "1", "--set", "data.shards=1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    err = done.stderr
    said = [line for line in err.splitlines() if line.startswith("vcdl: ")]
    assert done.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert said[-1] == (
        f"vcdl: warning: the run's log {log} is cut short: its disk is full (no space left on "
        "device); free space on it for the next run's log (the run's state is in its ledger "
        "and store, not in its log)"
    ), err[-3000:]
    assert "run full: completed" in done.stdout, done.stdout
    assert "=== vcdl train full at " in log.read_text()  # its start, not its end
    from vcdl import api
    from vcdl.views.audit import audit_run

    assert audit_run(api.run_ref("full", log_disk), deep=True) == []


def test_a_log_whose_disk_fills_inside_the_block_ends_saying_so(
    log_disk: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """What the run's writers do to a full log: Python's logging to stderr, a raw write
    to file descriptor 2, a child process that inherited it. None of them stops the
    block; its end says the log is cut short."""
    import logging

    from vcdl.display import RunLog

    log = log_disk / "logs" / "run.log"
    log.write_text("an earlier session's lines\n" * 110)  # 3 KB: 1 KB left in its page
    _fill(log_disk / "logs")
    logger = logging.getLogger("vcdl.test.fulllog")
    with RunLog(log, "vcdl train run") as runlog:
        # A worker's lines: the child fills the last page and gets ENOSPC for the rest.
        subprocess.run(["sh", "-c", "head -c 100000 /dev/zero >&2"], check=False)
        with pytest.raises(OSError, match="No space left"):
            os.write(2, b"y" * 8000)
        # Prefect's and Dask's lines (pytest's capture stands in for sys.stderr here).
        with os.fdopen(os.dup(2), "w") as stderr:
            handler = logging.StreamHandler(stderr)
            logger.addHandler(handler)
            try:
                logger.error("x" * 8000)  # logging drops what it cannot write
            finally:
                logger.removeHandler(handler)
                with contextlib.suppress(OSError):
                    stderr.flush()
    assert runlog.cut_short == "no space left on device"
    _, err = capfd.readouterr()
    assert err.splitlines()[-1].startswith(f"vcdl: warning: the run's log {log} is cut short"), err
    assert log.read_text().startswith("an earlier session's lines\n")


def test_a_log_with_room_ends_with_its_end_line(tmp_path: Path) -> None:
    from vcdl.display import RunLog

    log = tmp_path / "logs" / "run.log"
    with RunLog(log, "vcdl train run") as runlog:
        os.write(2, b"a line\n")
    assert runlog.cut_short is None
    lines = log.read_text().splitlines()
    assert lines[0].startswith("=== vcdl train run at ") and lines[1] == "a line"
    assert lines[-1].startswith("=== vcdl train run ended at ")
