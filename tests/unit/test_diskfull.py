"""vcdl/diskfull.py: a full disk found however it surfaced, and the room a run needs."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from vcdl.diskfull import RUN_ROOM, disk_full, room_for_run
from vcdl.errors import DiskFull, LedgerError


def _enospc(filename: str | None = None) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)


def _raised_from(inner: BaseException, outer: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as caught:
        return caught


@pytest.mark.parametrize(
    "exc",
    [
        _enospc(),
        OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)),
        # zarr/asyncio wrap it, or a flow re-raises it as its own error.
        _raised_from(_enospc(), RuntimeError("writing the version failed")),
        ExceptionGroup("tasks", [ValueError("x"), _enospc()]),
        # Only the text survives: SQLite's SQLITE_FULL through the ledger, a remote OSError.
        LedgerError("ledger sqlite:///x.db: database or disk is full"),
        RuntimeError("[Errno 28] No space left on device"),
    ],
    ids=["enospc", "edquot", "cause", "group", "sqlite-text", "remote-text"],
)
def test_a_full_disk_is_found_however_it_surfaced(exc: BaseException) -> None:
    full = disk_full(exc)
    assert isinstance(full, DiskFull) and full.exit_code == 2
    assert str(full).startswith("the disk is full (")
    assert "free space on it and run the command again" in str(full)
    assert "--home" in str(full) and "\n" not in str(full)


def test_other_errors_are_no_full_disk() -> None:
    assert disk_full(OSError(errno.EACCES, "Permission denied")) is None
    assert disk_full(_raised_from(KeyError("x"), ValueError("y"))) is None


def test_the_line_names_the_file_and_the_run_to_resume() -> None:
    full = disk_full(_enospc("/data/store/runs/r/v3/c.0"), run="r")
    assert full is not None
    assert "(no space left on device writing /data/store/runs/r/v3/c.0)" in str(full)
    assert "`vcdl resume r` continues the run" in str(full)


def test_a_self_referencing_chain_ends() -> None:
    a, b = ValueError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a
    assert disk_full(a) is None


def test_a_run_needs_room_in_its_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    room_for_run(tmp_path / "not" / "made" / "yet")  # this disk has room: nothing raised

    class Usage:
        free = RUN_ROOM - 1

    monkeypatch.setattr("vcdl.diskfull.shutil.disk_usage", lambda _p: Usage)
    with pytest.raises(DiskFull, match=r"the disk of .* is full \(31 MiB free, a run needs 32"):
        room_for_run(tmp_path)
