"""``vcdl runs``, ``status``, ``story``, ``workers``, ``cost``, ``audit`` and ``gc``: what the
ledger says of runs."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from vcdl.cli.json_output import emit, report

if TYPE_CHECKING:
    from vcdl.cli.parser import Parents, Subparsers


def add_parsers(sub: Subparsers, parents: Parents) -> None:
    reporting = parents.reporting
    sub.add_parser("runs", parents=reporting, help="list runs")

    s = sub.add_parser("status", parents=reporting, help="a run's state and history")
    s.add_argument("run")

    st = sub.add_parser(
        "story",
        parents=reporting,
        help="everything that happened to a run's subtasks: attempts, workers, kills, "
        "notices and tasks handed back, reissues and why, rejections, the merge and its version",
    )
    st.add_argument("run")
    st.add_argument("--epoch", type=int, help="only this epoch's subtasks, a line each")
    st.add_argument(
        "--shard", type=int, help="only this shard's subtask (with --epoch: its whole timeline)"
    )
    st.add_argument(
        "--all", action="store_true", help="list every subtask (a summary lists at most 50)"
    )

    w = sub.add_parser(
        "workers",
        parents=reporting,
        help="each worker of a run: attempts and how they ended, its pace (samples a second), "
        "how busy it was, the staleness of its merges, the time it wasted",
    )
    w.add_argument("run")
    w.add_argument("--epoch", type=int, help="only this epoch's attempts")

    co = sub.add_parser("cost", parents=reporting, help="a run's cost, waste and spot savings")
    co.add_argument("run")
    co.add_argument(
        "--instance",
        help="instance type of every worker (default: the run's cost.instance_type)",
    )
    co.add_argument(
        "--prices", help="TOML file overriding vcdl's dated list prices (default: cost.prices)"
    )

    a = sub.add_parser(
        "audit", parents=reporting, help="check a run's invariants (exit 1 if any fail)"
    )
    a.add_argument("run")
    a.add_argument("--deep", action="store_true", help="verify every version's checksums")

    g = sub.add_parser(
        "gc",
        parents=reporting,
        help="apply the run's retention policy (store.keep): prune versions, delete dead "
        "results and checkpoints, report the bytes freed",
    )
    g.add_argument("run")
    g.add_argument("--dry-run", action="store_true", help="report what would go; change nothing")


def print_summary(summary: dict[str, Any], as_json: bool) -> None:
    """A run's summary (``vcdl status``, the end of ``vcdl train``) as its document or text."""
    if as_json:
        emit(summary)
        return
    import shutil

    from vcdl.views.summary import summary_lines

    # A terminal's width; a pipe's lines are left long (but for the phases).
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    print("\n".join(summary_lines(summary, width)))


def runs_command(args: argparse.Namespace) -> int:
    from vcdl import api
    from vcdl.errors import LedgerNotFound
    from vcdl.views.status import listed_run

    try:
        runs = api.existing_ledger(args.home, args.ledger).list_runs()
    except LedgerNotFound as exc:
        if not report(args, {"runs": [], "ledger_found": False}):
            print(f"no runs yet ({exc})")
        return 0
    if report(args, {"runs": [listed_run(r) for r in runs], "ledger_found": True}):
        return 0
    if not runs:
        print("no runs yet: `vcdl train CONFIG` starts one")
    for r in runs:
        print(
            f"{r.name:30} {r.state:10} epochs {r.epochs_completed:>4} "
            f"head v{r.head_version:<6} {r.updated_at:%Y-%m-%d %H:%M}"
        )
    return 0


def status_command(args: argparse.Namespace) -> int:
    from vcdl import api

    print_summary(api.status(args.run, args.home, args.ledger), args.json)
    return 0


def story_command(args: argparse.Namespace) -> int:
    import shutil

    from vcdl import api
    from vcdl.views.story import read_story
    from vcdl.views.story_text import WIDTH, story_text

    ledger = api.existing_ledger(args.home, args.ledger)
    told = read_story(ledger, args.run, epoch=args.epoch, shard=args.shard)
    if not report(args, told.to_dict()):
        width = max(shutil.get_terminal_size().columns, 60) if sys.stdout.isatty() else WIDTH
        print(story_text(told, width=width, every=args.all))
    return 0


def workers_command(args: argparse.Namespace) -> int:
    from vcdl import api
    from vcdl.views.workers import document_text, read_workers

    doc = read_workers(api.existing_ledger(args.home, args.ledger), args.run, epoch=args.epoch)
    if not report(args, doc):
        print(document_text(doc))
    return 0


def cost_command(args: argparse.Namespace) -> int:
    from vcdl import api
    from vcdl.views.cost import format_cost

    cost_report = api.run_cost(
        args.run,
        instance=args.instance,
        prices=args.prices,
        home=args.home,
        ledger_url=args.ledger,
    )
    if not report(args, cost_report):
        print(format_cost(cost_report))
    return 0


def audit_command(args: argparse.Namespace) -> int:
    from vcdl import api
    from vcdl.views.audit import audit_run

    problems = audit_run(api.run_ref(args.run, args.home, args.ledger), deep=args.deep)
    doc = {"run": args.run, "deep": args.deep, "ok": not problems, "violations": problems}
    if report(args, doc):
        return 1 if problems else 0
    for p in problems:
        print(f"VIOLATION: {p}")
    if problems:
        print(f"audit of {args.run}: {len(problems)} violation(s)", file=sys.stderr)
        return 1
    print(f"audit of {args.run}: ok")
    return 0


def gc_command(args: argparse.Namespace) -> int:
    from vcdl import api
    from vcdl.driver.gc import format_report

    ref = api.run_ref(args.run, args.home, args.ledger)
    gc = api.collect_garbage(ref, dry_run=args.dry_run)
    if not report(args, gc.to_dict()):
        print(format_report(gc))
    return 0
