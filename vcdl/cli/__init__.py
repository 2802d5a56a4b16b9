"""The ``vcdl`` command line: parses, calls the library or a flow, prints. No logic.

A module per command group, each adding its commands to the parser
(``add_parsers``) and holding their handlers; :data:`COMMANDS` maps a
command to its handler, and :func:`main` runs it:

- :mod:`.train`: ``train``, ``resume``
- :mod:`.chaos`: ``chaos``
- :mod:`.runs`: ``runs``, ``status``, ``story``, ``cost``, ``audit``, ``gc``
- :mod:`.replay`: ``replay``, ``diff``
- :mod:`.export`: ``export``, ``evaluate``
- :mod:`.serve`: ``serve``
- :mod:`.data`: ``data make``, ``data import``, ``data list``
- :mod:`.fleet`: ``fleet check``
- :mod:`.completion`: ``completion`` and the shell scripts it writes

and beside them :mod:`.parser` (the parser, its shared options, its usage
errors), :mod:`.json_output` (``--json``: one document on stdout) and
:mod:`.__main__` (``python -m vcdl.cli``). What a command does besides
parsing and printing is in :mod:`vcdl.api` and :mod:`vcdl.views`.

Exit codes: 0 success, 1 failure at run time (or audit violations), 2 bad
input (config, data set, model, unknown run) or a full disk
(:mod:`vcdl.diskfull`, whatever wrote), 130 interrupted (Ctrl-C), 143
terminated (SIGTERM: a spot notice, ``docker stop``; :mod:`vcdl.termination`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from vcdl.cli import chaos, completion, data, export, fleet, replay, runs, serve, train
from vcdl.cli.json_output import error_document, json_mode, wants_json
from vcdl.cli.parser import UsageError, build_parser
from vcdl.errors import VcdlError
from vcdl.termination import TERMINATED_EXIT, Terminated, sigterm_as_interrupt

__all__ = ["COMMANDS", "main"]

#: The most characters an error's line shows; a longer one is cut in its middle.
MESSAGE_MAX = 1000

#: Each command's handler: it returns the exit code.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "train": train.train_command,
    "resume": train.resume_command,
    "chaos": chaos.chaos_command,
    "runs": runs.runs_command,
    "status": runs.status_command,
    "story": runs.story_command,
    "workers": runs.workers_command,
    "replay": replay.replay_command,
    "diff": replay.diff_command,
    "cost": runs.cost_command,
    "audit": runs.audit_command,
    "gc": runs.gc_command,
    "export": export.export_command,
    "evaluate": export.evaluate_command,
    "serve": serve.serve_command,
    "data": data.data_command,
    "fleet": fleet.fleet_command,
    "completion": completion.completion_command,
}


def _fail(message: str, code: int, as_json: bool = False, kind: str = "Error") -> NoReturn:
    from vcdl.redact import redact_text

    # Any URL in the message is shown redacted, wherever the error came from, and
    # on one line: a driver's message (psycopg's, say) may span several.
    shown = " ".join(line.strip() for line in redact_text(message).splitlines() if line.strip())
    if len(shown) > MESSAGE_MAX:
        # Whatever a message echoes (a 5,000-character argument), the line stays readable.
        cut = (MESSAGE_MAX - 5) // 2
        shown = f"{shown[:cut]} ... {shown[-cut:]}"
    if as_json:
        print(error_document(kind, shown, code), file=sys.stderr)
    else:
        print(f"vcdl: error: {shown}", file=sys.stderr)
    raise SystemExit(code)


def _fail_if_disk_full(exc: BaseException, args: argparse.Namespace, as_json: bool) -> None:
    """A full disk behind ``exc``, whoever wrote: its one line, exit 2 (not a traceback)."""
    from vcdl.diskfull import disk_full

    run = getattr(args, "resumable", None) or getattr(args, "run", None)
    full = disk_full(exc, run if args.command in ("train", "resume") else None)
    if full is not None:
        _fail(str(full), full.exit_code, as_json, "DiskFull")


def _dispatch(args: argparse.Namespace) -> int:
    return COMMANDS[args.command](args)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = wants_json(argv)
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        if not as_json:
            sys.stderr.write(exc.usage)
        _fail(exc.message, 2, as_json, "UsageError")
    # Only a command that has --json answers in JSON; the parser refused it elsewhere.
    as_json = bool(getattr(args, "json", False))
    try:
        with sigterm_as_interrupt(), json_mode() if as_json else contextlib.nullcontext():
            code = _dispatch(args)
        # Inside the try: a reader that already left (`| head`) breaks the
        # pipe here, not in the interpreter's own flush at exit.
        sys.stdout.flush()
    except VcdlError as exc:
        _fail_if_disk_full(exc, args, as_json)
        _fail(str(exc), exc.exit_code, as_json, type(exc).__name__)
    except KeyboardInterrupt as exc:
        # Only a run has something to resume (`vcdl serve` or `vcdl chaos` do not).
        # Its name, once known: from the config (set by train.py) or the command line.
        run = getattr(args, "resumable", None) or getattr(args, "run", None) or "RUN"
        hint = (
            f"; `vcdl resume {run}` continues from the ledger"
            if args.command in ("train", "resume")
            else ""
        )
        if isinstance(exc, Terminated):
            _fail(f"terminated (SIGTERM){hint}", TERMINATED_EXIT, as_json, "Terminated")
        _fail(f"interrupted{hint}", 130, as_json, "Interrupted")
    except BrokenPipeError:
        # The reader took what it wanted: stop quietly, as `cat` does. Python's
        # final flush would raise again on the closed pipe, so stdout goes to
        # /dev/null first. 141 = 128 + SIGPIPE, what a shell reports for `cat`.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(141) from None
    except Exception as exc:
        _fail_if_disk_full(exc, args, as_json)
        if not as_json:
            raise  # the traceback, as ever
        # A bug or an unforeseen failure: still one document, exit 1 as a traceback has.
        _fail(f"{type(exc).__name__}: {exc}", 1, True, type(exc).__name__)
    raise SystemExit(code)
