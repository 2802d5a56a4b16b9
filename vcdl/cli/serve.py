"""``vcdl serve``: the vcdl deployments served from this process (one machine, no work pool)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from vcdl.config_files import resolve_home

if TYPE_CHECKING:
    from vcdl.cli.parser import Parents, Subparsers


def add_parsers(sub: Subparsers, parents: Parents) -> None:
    sv = sub.add_parser(
        "serve",
        parents=[parents.common],
        help="serve the vcdl-train, vcdl-retrain and vcdl-evaluate deployments from this "
        "process (one machine, no work pool)",
    )
    sv.add_argument(
        "--parent", default="mnist1d", help="vcdl-retrain's default parent run (default: mnist1d)"
    )
    sv.add_argument("--limit", type=int, help="flow runs at a time (default: no limit)")


def serve_command(args: argparse.Namespace) -> int:
    from vcdl import api

    home = resolve_home(args.home)
    api.prepare_prefect(home)
    # Only now: importing the flows imports Prefect, which prepare_prefect must precede.
    from flows.deployments import NAMES, RETRAIN_CRON, serve

    print(
        f"vcdl: serving {', '.join(NAMES)} (vcdl-retrain schedule '{RETRAIN_CRON}' UTC, "
        f"inactive until enabled); state in {home}; Ctrl-C stops",
        file=sys.stderr,
    )
    serve(home=str(home), parent=args.parent, limit=args.limit)
    return 0
