"""``vcdl replay``: a run re-executed from its ledger, compared version by version."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from vcdl.cli.json_output import report

if TYPE_CHECKING:
    from vcdl.cli.parser import Parents, Subparsers


def add_parsers(sub: Subparsers, parents: Parents) -> None:
    r = sub.add_parser(
        "replay",
        parents=parents.reporting,
        help="re-train and re-merge a run's versions on this CPU and compare each with the "
        "ledger: the first divergence (version, attempt, tensor) or bit for bit",
    )
    r.add_argument("run")
    r.add_argument(
        "--from",
        dest="first",
        type=int,
        default=0,
        metavar="VERSION",
        help="start from this kept version (default 0)",
    )
    r.add_argument(
        "--keep-going",
        action="store_true",
        default=None,
        help="after a divergence go on from the recorded version and report each version's "
        "largest deviation (the default for a run trained on a GPU)",
    )
    r.add_argument(
        "--to",
        dest="last",
        type=int,
        metavar="VERSION",
        help="stop at this version (default: the newest)",
    )


def replay_command(args: argparse.Namespace) -> int:
    from vcdl import api
    from vcdl.replay.text import replay_text

    tty = sys.stderr.isatty()
    shown = [0.0]

    def progress(done: int, total: int, version: int) -> None:
        # On the terminal a line redrawn; in a log one line every few seconds.
        now = time.monotonic()
        if done < total and now - shown[0] < (0.2 if tty else 5.0):
            return
        shown[0] = now
        end = "\n" if not tty or done == total else ""
        print(f"\rreplay {args.run}: version {version} ({done}/{total})", end=end, file=sys.stderr)

    told = api.replay(
        args.run,
        args.home,
        args.ledger,
        first=args.first,
        last=args.last,
        progress=progress,
        keep_going=args.keep_going,
    )
    if not report(args, told.to_dict()):
        print(replay_text(told))
    return 0 if told.bit_for_bit else 1
