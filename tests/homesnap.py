"""A vcdl home with something in it, and every byte of it, to show a refusal wrote nothing.

Issue 54's acceptance: a refused command (a hostile import, a bad config)
writes nothing. An empty home that stays empty shows only half of it: here
:func:`populated_home` makes a home as a user has one (a data set in the
store, a ledger, a run's log), and :func:`snapshot` lists every file and
folder under it with a file's bytes, its permission bits and its
modification time, so that a test compares the home before and after.
"""

from __future__ import annotations

import gc
import os
import shutil
import stat
from pathlib import Path

__all__ = ["assert_unchanged", "copy_home", "populated_home", "snapshot"]


def snapshot(root: Path) -> dict[str, tuple[str, int, int, bytes]]:
    """Every path under ``root`` (relative) -> (kind, mode, mtime in ns, a file's bytes).

    Empty where ``root`` does not exist; a link is listed, not followed.
    """
    if not root.exists():
        return {}
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        if stat.S_ISREG(st.st_mode):
            kind, content = "file", path.read_bytes()
        elif stat.S_ISDIR(st.st_mode):
            kind, content = "folder", b""
        elif stat.S_ISLNK(st.st_mode):
            kind, content = "link", os.readlink(path).encode()
        else:
            kind, content = "other", b""
        mtime = st.st_mtime_ns if kind != "folder" else 0  # a folder's is its listing's
        out[str(path.relative_to(root))] = (kind, stat.S_IMODE(st.st_mode), mtime, content)
    return out


def assert_unchanged(before: dict[str, tuple[str, int, int, bytes]], root: Path) -> None:
    """Fail naming what was added, removed or changed under ``root`` since ``before``.

    Garbage is collected first: a command run in this process may leave a ledger's
    connection to be closed, as its own process's end would close it (SQLite then
    removes the ``-wal`` and ``-shm`` files a reader made).
    """
    gc.collect()
    after = snapshot(root)
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(p for p in set(before) & set(after) if before[p] != after[p])
    assert not (added or removed or changed), (
        f"{root}: added {added[:10]}, removed {removed[:10]}, changed {changed[:10]}"
    )


def populated_home(where: Path) -> Path:
    """A home at ``where`` holding the ``digits`` data set, an empty ledger and a run's log."""
    from vcdl import api
    from vcdl.ledger import Ledger

    api.make_dataset(api.data_store(None, where), "digits")
    Ledger(f"sqlite:///{where / 'ledger.db'}").close()
    (where / "logs").mkdir(exist_ok=True)
    (where / "logs" / "earlier.log").write_text("a run's log from before\n")
    return where


def copy_home(template: Path, where: Path) -> Path:
    """A copy of ``template`` at ``where``, times and modes kept."""
    shutil.copytree(template, where, symlinks=True)
    return where
