"""``vcdl fleet check``: can every worker of a Dask cluster do a run's job? (vcdl.fleetcheck)"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from vcdl.cli.json_output import report
from vcdl.cli.parser import Parser, bounded

if TYPE_CHECKING:
    from vcdl.cli.parser import Parents, Subparsers


def add_parsers(sub: Subparsers, parents: Parents) -> None:
    f = sub.add_parser("fleet", help="check the workers of a Dask cluster")
    fsub = f.add_subparsers(dest="fleet_command", required=True, parser_class=Parser)
    c = fsub.add_parser(
        "check",
        parents=parents.reporting,
        help="whether every worker reaches the scheduler, store and ledger and runs the code",
    )
    c.add_argument("config", nargs="?", help="run config (TOML): its store, ledger and code")
    c.add_argument("--address", help="scheduler address (default: the config's cluster.address)")
    c.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value (repeatable), as for vcdl train",
    )
    c.add_argument(
        "--timeout",
        type=bounded(1, 3600),
        default=60,
        metavar="SECONDS",
        help="how long each worker may take to answer (default 60)",
    )
    c.add_argument(
        "--max-skew",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how far a worker's clock may be off the driver's (default 5)",
    )


def fleet_command(args: argparse.Namespace) -> int:
    from vcdl.errors import ConfigError
    from vcdl.fleetcheck import gather, render, verdict

    cfg = None
    if args.config:
        cfg = gather.run_config(args.config, args.overrides, args.home, args.ledger)
    elif args.overrides or args.ledger:
        raise ConfigError("--set and --ledger apply to a run config: give CONFIG too")
    address = args.address or (cfg.cluster.address if cfg else None)
    if not address:
        raise ConfigError(
            "fleet check needs a scheduler: give --address tcp://10.0.0.5:8786 "
            "or a CONFIG whose cluster.address names one"
        )
    if not 0 <= args.max_skew < 86400:
        raise ConfigError(f"--max-skew {args.max_skew:g}: give seconds from 0 to 86400")
    spec, needs, _ = gather.probe_spec(cfg, float(args.timeout))
    needs = dataclasses.replace(needs, max_skew=args.max_skew)
    reports = gather.gather(address, spec, float(args.timeout))
    judged = verdict.judge(reports, gather.driver_versions(), needs)
    doc = render.document(address, gather.driver_versions(), spec, judged, needs, args.timeout)
    if not report(args, doc):
        print(render.text(doc))
    # 2, as for bad input: the fleet cannot run this config until what is named is fixed.
    return 0 if doc["ok"] else 2
