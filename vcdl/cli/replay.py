"""``vcdl replay`` (a run re-executed from its ledger, compared version by version; with
``--as NEW`` and a change, ``--reject ATTEMPT`` or ``--alpha A``/``--rule RULE`` [``--from
VERSION``], a what-if into a new run) and ``vcdl diff``."""

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
        metavar="VERSION",
        help="start from this kept version (default 0); with --as and --alpha or --rule, the "
        "first version made with the change (the ones before are re-made as recorded)",
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
        "--alpha",
        type=float,
        metavar="A",
        help="what-if (with --as): merge with this constant α in (0, 1] (the head's weight) "
        "instead of the run's schedule",
    )
    r.add_argument(
        "--rule",
        metavar="RULE",
        help="what-if (with --as): merge with this rule (vc_asgd, delta, diloco, ...)",
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

    problem = what_if_problem(args)
    if problem is not None:
        raise ConfigError(problem)
    if args.new_run is not None:
        from vcdl.replay.whatif import what_if_text

        made = api.what_if(
            args.run,
            args.new_run,
            args.reject,
            args.home,
            args.ledger,
            alpha=args.alpha,
            rule=args.rule,
            first=args.first,
            progress=progress,
        )
        if not report(args, made.to_dict()):
            print(what_if_text(made))
        return 0
    told = api.replay(
        args.run,
        args.home,
        args.ledger,
        first=args.first or 0,
        last=args.last,
        progress=progress,
        keep_going=args.keep_going,
    )
    if not report(args, told.to_dict()):
        print(replay_text(told))
    return 0 if told.bit_for_bit else 1


def what_if_problem(args: argparse.Namespace) -> str | None:
    """Why ``vcdl replay``'s options do not go together, or None (before any run is read)."""
    from vcdl.replay.change import Change, request_problem

    changes = [f"--{k}" for k in ("reject", "alpha", "rule") if getattr(args, k) is not None]
    if args.new_run is None:
        if changes:
            return f"{changes[0]} is a what-if: name its new run with --as NEW_RUN"
        return None
    if args.last is not None:
        return (
            "--to is a replay's: a what-if re-executes the whole run "
            "(with --alpha or --rule, --from says where the change starts)"
        )
    if args.keep_going is not None:
        return "--keep-going is a replay's: a what-if compares nothing"
    return request_problem(Change(args.reject, args.alpha, args.rule, args.first))
