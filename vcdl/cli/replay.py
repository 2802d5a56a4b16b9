"""``vcdl replay`` (a run re-executed from its ledger, compared version by version; with
``--as NEW --reject ATTEMPT`` a what-if into a new run) and ``vcdl diff``."""

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
        "--as", dest="new_run", metavar="NEW_RUN", help="what-if: re-execute into this new run"
    )
    r.add_argument(
        "--reject",
        metavar="ATTEMPT",
        help="what-if (with --as): leave out this merged attempt's result (an id or its start)",
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

    d = sub.add_parser(
        "diff",
        parents=parents.reporting,
        help="where two runs part (a run and its what-if) and both heads' test metrics",
    )
    d.add_argument("run")
    d.add_argument("other")


def diff_command(args: argparse.Namespace) -> int:
    from vcdl import api
    from vcdl.replay.diff import diff_text

    told = api.diff(args.run, args.other, args.home, args.ledger)
    if not report(args, told.to_dict()):
        print(diff_text(told))
    return 0


def replay_command(args: argparse.Namespace) -> int:
    from vcdl import api
    from vcdl.errors import ConfigError
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

    if (args.new_run is None) != (args.reject is None):
        raise ConfigError("--as NEW_RUN and --reject ATTEMPT go together (a what-if)")
    if args.new_run is not None:
        made = api.what_if(
            args.run, args.new_run, args.reject, args.home, args.ledger, progress=progress
        )
        if not report(args, made.to_dict()):
            print(
                f"run {made.new_run}: {made.run} without attempt {made.rejected[:12]}, "
                f"{made.merged} merges, head v{made.head}; vcdl diff {made.run} {made.new_run}"
            )
        return 0
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
