"""How a process starts on a worker host: its network, and a disk without the driver's files.

``ip netns exec`` gives a process the host's network but the machine's whole
filesystem, the driver's home included. So each host's processes also run
in a mount namespace of their own (``unshare --mount``) in which every hidden
path (``/tmp``, where the driver's home and the tests' folders are; the
driver's ``$HOME``; PostgreSQL's socket folder, which would reach the ledger
past the link) is an empty tmpfs, private to that host. What the software
needs under a hidden path (the Python interpreter under ``$HOME``) is bound
back read-only. The process starts in ``cwd`` after the mounts, so no
working directory keeps a hidden folder open.

This keeps an honest worker off the driver's disk; it is no sandbox: the
process is root in its mount namespace and could unmount the tmpfs.
``/dev/shm`` is not hidden.

``setpriv --pdeathsig KILL`` ends the process if the fleet's owner dies
(the thread that started it, in fact: start hosts from the main thread);
``ip netns exec``, ``unshare`` and the shell each ``exec`` the next, so the
pid the fleet holds is the host's process itself.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["default_hidden", "default_kept", "host_command"]


def default_hidden() -> list[str]:
    """The paths a worker host must not see: temp folders, the driver's home, local sockets."""
    paths = ["/tmp", "/var/tmp", str(Path.home()), "/run/postgresql"]
    return [p for p in paths if os.path.isdir(p)]


def default_kept() -> list[str]:
    """What a worker needs even under a hidden path: the Python installation."""
    return sorted({os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)})


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def host_command(
    namespace: str,
    argv: Sequence[str],
    cwd: str,
    hidden: Sequence[str] | None = None,
    kept: Sequence[str] | None = None,
) -> list[str]:
    """The command that runs ``argv`` on host ``namespace`` in ``cwd``, ``hidden`` hidden."""
    hide = [os.path.realpath(p) for p in (default_hidden() if hidden is None else hidden)]
    keep = [
        p for p in (default_kept() if kept is None else kept) if any(_under(p, h) for h in hide)
    ]
    if any(_under(os.path.realpath(cwd), h) for h in hide):
        raise ValueError(f"cwd {cwd} is under a hidden path {hide}")
    q = shlex.quote
    lines = ["set -e"]
    # Open each kept folder before its parent is covered, bind it back from
    # the open descriptor (no path names it any more), read-only.
    lines += [f"exec {3 + i}<{q(p)}" for i, p in enumerate(keep)]
    lines += [f"mount -t tmpfs -o mode=1777 netfleet {q(h)}" for h in hide]
    for i, p in enumerate(keep):
        lines += [
            f"mkdir -p {q(p)}",
            f"mount --no-canonicalize --bind /proc/self/fd/{3 + i} {q(p)}",
            f"mount --no-canonicalize -o remount,bind,ro {q(p)}",
            f"exec {3 + i}<&-",
        ]
    lines += [f"cd {q(cwd)}", 'exec "$@"']
    return [
        "setpriv", "--pdeathsig", "KILL", "--",
        "ip", "netns", "exec", namespace,
        "unshare", "--mount", "--propagation", "private", "--",
        "/bin/sh", "-c", "\n".join(lines), "netfleet-host", *argv,
    ]  # fmt: skip
