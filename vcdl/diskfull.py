"""A full disk, recognised wherever it surfaces, and said in one line with what to do.

A disk (or a quota) runs out under whatever happens to write next: the
store's Zarr files (a version, a result, an imported data set), the SQLite
ledger ("database or disk is full"), the run's log. Each surfaces in its own
way: a bare :class:`OSError` with ``errno`` ENOSPC or EDQUOT, an error of
vcdl's or a library's that wraps one (as ``__cause__`` or ``__context__``, in
an exception group, or only as text, as SQLite and Dask's remote errors do).
:func:`disk_full` finds it in any of those; the CLI turns what it finds
into :class:`~vcdl.errors.DiskFull`'s line, exit 2, instead of a traceback.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from vcdl.errors import DiskFull

__all__ = ["RUN_ROOM", "disk_full", "room_for_run"]

RUN_ROOM = 32 << 20
"""Free bytes a run's home needs to start: Prefect's database (a few MB when new), the
ledger and the run's log. With less, Prefect's temporary server failed to start in
minutes, its reason hidden in a subprocess (a timeout traceback)."""

_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# How a full disk reads where only a message survives: the C library's
# strerror (a remote or re-wrapped OSError), SQLite's SQLITE_FULL.
_TEXTS = ("No space left on device", "Disk quota exceeded", "database or disk is full")


def _found(exc: BaseException) -> BaseException | None:
    """``exc`` or an exception it holds that says the disk is full; depth-first, each once."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _ERRNOS:
            return e
        if any(text in str(e) for text in _TEXTS):
            return e
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
    return None


def disk_full(exc: BaseException, run: str | None = None) -> DiskFull | None:
    """The :class:`DiskFull` to report for ``exc``, or None if no full disk is behind it.

    ``run``: the run a ``train``/``resume`` was driving, named in what to do next.
    """
    if isinstance(exc, DiskFull):
        return exc
    found = _found(exc)
    if found is None:
        return None
    where = getattr(found, "filename", None)
    at = f" writing {str(where)[:200]}" if where else ""
    quota = isinstance(found, OSError) and found.errno == errno.EDQUOT
    what = "disk quota exceeded" if quota else "no space left on device"
    again = f"`vcdl resume {run}` continues the run" if run else "run the command again"
    return DiskFull(
        f"the disk is full ({what}{at}); free space on it and {again}, or give vcdl a "
        "disk with room (--home or $VCDL_HOME; a run's store.url and ledger.url; --store "
        "for `vcdl data`)"
    )


def room_for_run(home: Path) -> None:
    """Raise :class:`DiskFull` when the disk of ``home`` (or its nearest existing parent)
    has less than :data:`RUN_ROOM` free: before a run starts Prefect there."""
    there = home
    while not there.exists() and there != there.parent:
        there = there.parent
    try:
        free = shutil.disk_usage(there).free
    except OSError:
        return  # cannot tell: the run's own writes will say
    if free < RUN_ROOM:
        raise DiskFull(
            f"the disk of {home} is full ({free >> 20} MiB free, a run needs "
            f"{RUN_ROOM >> 20} MiB for Prefect's database, the ledger and its log); free "
            "space on it, or pass a --home (or $VCDL_HOME) on a disk with room"
        )
