"""``vcdl chaos``: preempt the workers of a running Dask cluster (the simulator, standalone)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from vcdl.cli.json_output import report

if TYPE_CHECKING:
    from vcdl.cli.parser import Parents, Subparsers


def add_parsers(sub: Subparsers, parents: Parents) -> None:
    c = sub.add_parser(
        "chaos", parents=[parents.json], help="preempt the workers of a running Dask cluster"
    )
    c.add_argument("scheduler", help="scheduler address, e.g. tcp://127.0.0.1:8786")
    c.add_argument("--rate", type=float, required=True, help="events per second (Poisson)")
    c.add_argument("--duration", type=float, required=True, help="seconds to run")
    c.add_argument("--notices", type=float, default=0.25, help="fraction of events with notice")
    c.add_argument("--grace", type=float, default=2.0, help="seconds from notice to kill")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--log", help="JSON-lines file of every event")


def chaos_command(args: argparse.Namespace) -> int:
    from vcdl import api
    from vcdl.chaos import Preemptor, chaos_schedule

    api.check_chaos(
        ("--rate", args.rate),
        ("--notices", args.notices),
        ("--grace", args.grace),
        ("--duration", args.duration),
    )
    api.check_scheduler(args.scheduler)
    events = chaos_schedule(args.rate, args.duration, args.seed, args.notices)
    pre = Preemptor(args.scheduler, events, grace=args.grace, seed=args.seed, log_path=args.log)
    pre.start()
    pre.join()  # it waits for the last notice's kill to land
    doc = {
        "scheduler": args.scheduler,
        "rate": args.rate,
        "duration": args.duration,
        "notices": args.notices,
        "grace": args.grace,
        "seed": args.seed,
        "counts": pre.counts(),
    }
    if not report(args, doc):
        print(f"chaos: {pre.counts()} over {args.duration:.0f}s")
    return 0
