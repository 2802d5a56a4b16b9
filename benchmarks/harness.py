"""What every benchmark shares: its common options, the median, its JSON summary, its environment.

A benchmark is a module of this package run from the repository root as
``python -m benchmarks.NAME [options]`` (the tests import its functions as
``benchmarks.NAME``; no module edits the import path). Each one:

* takes the common options, :func:`add_common_options`: ``--quick`` (a short
  run for CI), ``--repeats N`` (runs per figure; figures are medians),
  ``--json`` (stdout holds only the summary line; the tables and progress go
  to stderr) and ``--out PATH`` (the summary also written to PATH);
* does its human-readable printing inside :func:`human_output`;
* ends with :func:`emit_summary`: one JSON line on stdout,
  ``{"benchmark": NAME, <its figures>..., "env": <run_environment()>}``, the
  line the tests and ``docs/results.md`` read.

A benchmark whose work has no short or no repeated form leaves that option
out and says why in its docstring.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["add_common_options", "emit_summary", "human_output", "median", "run_environment"]

REPO = Path(__file__).resolve().parent.parent
#: The distributions whose versions a run's environment names.
VERSIONS = ("vcdl", "torch", "dask", "distributed", "prefect", "zarr", "numpy")


def add_common_options(
    parser: argparse.ArgumentParser,
    *,
    quick_help: str | None,
    repeats_default: int | None = None,
    repeats_help: str = "runs per figure; figures are medians",
    repeats: bool = True,
) -> argparse.ArgumentParser:
    """Add ``--quick`` (unless ``quick_help`` is None), ``--repeats`` (unless not
    ``repeats``; default ``repeats_default``, None where the benchmark picks it
    after ``--quick``), ``--json`` and ``--out`` to ``parser``; return it."""
    if quick_help is not None:
        parser.add_argument("--quick", action="store_true", help=quick_help)
    if repeats:
        default = f" (default {repeats_default})" if repeats_default is not None else ""
        parser.add_argument(
            "--repeats", type=int, default=repeats_default, metavar="N", help=repeats_help + default
        )
    parser.add_argument(
        "--json", action="store_true", help="print only the JSON summary line (tables to stderr)"
    )
    parser.add_argument(
        "--out", type=Path, metavar="PATH", help="also write the JSON summary to PATH"
    )
    return parser


def median(values: Iterable[float]) -> float:
    """The median of ``values`` (the mean of the middle two for an even count).

    Raises :class:`ValueError` for no values: a figure of no run is no figure.
    """
    vals = list(values)
    if not vals:
        raise ValueError("median of no values")
    return statistics.median(vals)


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def run_environment() -> dict[str, Any]:
    """Where and on what a run ran: the commit (``"unknown"`` outside a git
    checkout) and whether tracked files differed from it, the machine, the
    Python and the packages' versions, and the time (UTC, ISO 8601)."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {
        "commit": commit or "unknown",
        "dirty": None if status is None else bool(status),
        "hostname": socket.gethostname(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "versions": {name: _version(name) for name in VERSIONS},
        "utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


@contextlib.contextmanager
def human_output(args: argparse.Namespace) -> Iterator[None]:
    """The benchmark's tables and progress: on stdout, or under ``--json`` on
    stderr (both ``sys.stdout`` and file descriptor 1, so that child processes
    follow), leaving stdout to the summary line."""
    if not getattr(args, "json", False):
        yield
        return
    sys.stdout.flush()
    # File descriptors 1 and 2 themselves (what child processes inherit),
    # whatever object sys.stdout is (a test's capture, for one).
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:
        saved = -1
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved >= 0:
            os.dup2(saved, 1)
            os.close(saved)


def emit_summary(
    name: str, figures: Mapping[str, Any], args: argparse.Namespace | None = None
) -> dict[str, Any]:
    """Print the one-line JSON summary ``{"benchmark": name, **figures, "env": ...}``
    (a ``"benchmark"`` key in ``figures`` wins over ``name``), write it to
    ``args.out`` if given, and return it."""
    summary: dict[str, Any] = {"benchmark": name, **figures, "env": run_environment()}
    line = json.dumps(summary)
    out = getattr(args, "out", None)
    if out is not None:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(line + "\n", encoding="utf-8")
    print(line, flush=True)
    return summary
