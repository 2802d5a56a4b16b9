"""``vcdl export`` and ``vcdl evaluate``: a version of a run written out, or evaluated."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from vcdl.cli.json_output import report
from vcdl.cli.parser import VERSION

if TYPE_CHECKING:
    from vcdl.cli.parser import Parents, Subparsers


def add_parsers(sub: Subparsers, parents: Parents) -> None:
    reporting = parents.reporting
    e = sub.add_parser("export", parents=reporting, help="write a version as .safetensors or .pt")
    e.add_argument("run")
    e.add_argument("--version", type=VERSION, help="version number (default: head)")
    e.add_argument("--out", required=True, help="output file (.safetensors or .pt)")
    e.add_argument("--force", action="store_true", help="replace --out if it exists")

    ev = sub.add_parser("evaluate", parents=reporting, help="evaluate a version on a data set")
    ev.add_argument("run")
    ev.add_argument("--version", type=VERSION)
    ev.add_argument("--data", help="data set name (default: the run's)")
    ev.add_argument("--split", default="test", choices=["train", "test"])


def export_command(args: argparse.Namespace) -> int:
    from vcdl import api
    from vcdl.driver.runs import export_version

    ref = api.run_ref(args.run, args.home, args.ledger)
    number, out = export_version(ref, args.out, args.version, force=args.force)
    doc = {
        "run": args.run,
        "version": number,
        "path": str(out.resolve()),
        "format": out.suffix.lstrip("."),
        "bytes": out.stat().st_size,
    }
    if not report(args, doc):
        print(f"exported {args.run} v{number} to {out}")
    return 0


def evaluate_command(args: argparse.Namespace) -> int:
    from vcdl import api
    from vcdl.driver.runs import evaluate_version
    from vcdl.ledger import evaluation_metrics
    from vcdl.views.epochs import format_metrics

    ref = api.run_ref(args.run, args.home, args.ledger)
    cfg = ref.config()
    api.allow_own_code(cfg)  # the run's recorded config, run by its operator
    ev = evaluate_version(ref, cfg, args.version, split=args.split, dataset=args.data)
    doc = {
        "run": args.run,
        "version": ev.version,
        "data": args.data or cfg.data.name,
        "split": args.split,
        "samples": ev.samples,
        "metrics": evaluation_metrics(ev),
        "accuracy": ev.accuracy,
        "loss": ev.loss,
        "evaluated_at": ev.created_at.isoformat(),
    }
    if report(args, doc):
        return 0
    print(
        f"{args.run} v{ev.version} on {args.data or cfg.data.name}:{args.split}: "
        f"{format_metrics(evaluation_metrics(ev), 'accuracy')} ({ev.samples} samples)"
    )
    return 0
