"""Issue 54, item 7: a disk that fills up is one line saying what to do, exit 2, no traceback.

On a real full disk, not a mocked write: a tmpfs of 1 MiB mounted for the
test (root only; skipped where it cannot be mounted), so the machine's own
disk is never filled. An import that fills it, a run whose home has no room
for Prefect's database, a ledger SQLite cannot grow, and (slow) a run whose
store fills up between versions.
"""

from __future__ import annotations

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
