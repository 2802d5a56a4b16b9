"""The CLI's ``--json`` mode: one JSON document on stdout, everything else on stderr.

A command that reports takes ``--json`` from :data:`JSON_OPTION` (a parent
parser) and hands its document to :func:`report`, which prints it only in
``--json`` mode and says so; the command prints its text otherwise. While
the command runs, :func:`json_mode` points stdout, the Python object and
file descriptor 1 both, at stderr (descriptor 2): a library's print, a log handler bound
to stdout or a Dask worker process writing to the descriptor it inherited
cannot spoil the document. The document is written to the real stdout
when the command is done. Errors become one document on stderr,
:func:`error_document`, with the exit code the plain mode has.

The documents' keys are listed in docs/cli.md; keys may be added, none is
renamed or removed without a note there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from collections.abc import Iterator
from typing import Any

JSON_OPTION = argparse.ArgumentParser(add_help=False)
JSON_OPTION.add_argument(
    "--json",
    action="store_true",
    help="print one JSON document on stdout (errors as JSON on stderr)",
)

_pending: list[Any] = []


def wants_json(argv: list[str]) -> bool:
    """Whether ``--json`` was asked for, before (or without) a successful parse."""
    return "--json" in argv[: argv.index("--")] if "--" in argv else "--json" in argv


def plain(value: Any) -> Any:
    """``value`` with non-finite floats as ``null``: strict JSON has no NaN or Infinity."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def dumps(doc: Any) -> str:
    """The document as strict JSON text; values JSON has no type for (dates) as strings."""
    return json.dumps(plain(doc), indent=2, default=str, allow_nan=False)


def report(args: argparse.Namespace, doc: Any) -> bool:
    """In ``--json`` mode keep ``doc`` as the command's output and return True.

    One document per command: a second is a bug in the command.
    """
    if not getattr(args, "json", False):
        return False
    emit(doc)
    return True


def emit(doc: Any) -> None:
    """Keep ``doc`` as the command's one document, printed when :func:`json_mode` ends."""
    if _pending:
        raise AssertionError("a command reported two JSON documents")
    _pending.append(doc)


def error_document(kind: str, message: str, exit_code: int) -> str:
    """``{"error": {"type", "message", "exit_code"}}`` as one line of JSON."""
    return json.dumps({"error": {"type": kind, "message": message, "exit_code": exit_code}})


@contextlib.contextmanager
def json_mode() -> Iterator[None]:
    """Run a command with stdout sent to stderr; then print its document on stdout."""
    _pending.clear()
    out = sys.stdout
    out.flush()
    saved: int | None = None
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no descriptor 1 or 2 (a closed stdout): the Python object only
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        # What the command left in stdout's buffer was meant for stdout: send it
        # to stderr, where it went while the command ran, not after the document.
        out.flush()
        sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)
    # Only after a command that returned: an error's document goes to stderr instead.
    if _pending:
        out.write(dumps(_pending.pop()) + "\n")
        out.flush()
