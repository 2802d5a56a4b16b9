"""``vcdl train`` and ``vcdl resume``: run the ``vcdl-train`` flow, its progress on the terminal."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from vcdl.chaos import DEFAULT_START
from vcdl.cli.parser import WORKERS, Parser, checked_name
from vcdl.cli.runs import print_summary
from vcdl.config_files import load_config, writable_home
from vcdl.diskfull import room_for_run

if TYPE_CHECKING:
    from pathlib import Path

    from vcdl.cli.parser import Parents, Subparsers
    from vcdl.config import RunConfig


def add_parsers(sub: Subparsers, parents: Parents) -> None:
    chaos_opts = Parser(add_help=False)
    chaos_opts.add_argument(
        "--preempt",
        type=float,
        default=0.0,
        metavar="RATE",
        help="simulate spot preemptions: worker kills/notices per second (Poisson)",
    )
    chaos_opts.add_argument(
        "--preempt-notices",
        type=float,
        default=0.25,
        metavar="FRACTION",
        help="share of events that are notices (SIGTERM, then a kill); default 0.25",
    )
    chaos_opts.add_argument(
        "--preempt-grace",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="seconds from a notice to its kill (default 2)",
    )
    chaos_opts.add_argument(
        "--preempt-seed", type=int, default=0, metavar="N", help="seed of the schedule and victims"
    )
    chaos_opts.add_argument(
        "--preempt-start",
        type=float,
        default=DEFAULT_START,
        metavar="SECONDS",
        help=f"seconds from the cluster's start to the first event (default {DEFAULT_START:g})",
    )
    chaos_opts.add_argument("--preempt-log", metavar="FILE", help="JSON-lines file of every event")
    t = sub.add_parser(
        "train",
        parents=[parents.common, chaos_opts, parents.json],
        help="train (or resume) a run from a TOML config",
    )
    t.add_argument("config", help="run config (TOML), e.g. examples/mnist1d.toml")
    t.add_argument("--run", help="run name (default: run.name, else the file name)")
    t.add_argument("--workers", type=WORKERS, help="LocalCluster worker processes")
    t.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value (repeatable), e.g. --set train.lr=0.01",
    )
    t.add_argument("-v", "--verbose", action="store_true", help="show Prefect's own logs")

    r = sub.add_parser(
        "resume",
        parents=[parents.common, chaos_opts, parents.json],
        help="continue a run from the ledger's state",
    )
    r.add_argument("run")
    r.add_argument("--workers", type=WORKERS)
    r.add_argument("-v", "--verbose", action="store_true")
    for parser in (t, r):
        parser.add_argument(
            "--metrics-port",
            type=int,
            metavar="PORT",
            help="serve the run's Prometheus metrics on PORT (metrics.port; see metrics.address)",
        )


def chaos_of(args: argparse.Namespace) -> dict[str, Any] | None:
    """The preemption simulator a ``train``/``resume`` asks for (flows.train.ChaosSpec), or None."""
    if args.preempt <= 0:
        return None
    return {
        "rate": args.preempt,
        "notice_fraction": args.preempt_notices,
        "grace": args.preempt_grace,
        "seed": args.preempt_seed,
        "start_after": args.preempt_start,
        "log": args.preempt_log,
    }


def _check_chaos(args: argparse.Namespace) -> None:
    from vcdl import api

    api.check_chaos(
        ("--preempt", args.preempt),
        ("--preempt-notices", args.preempt_notices),
        ("--preempt-grace", args.preempt_grace),
        start=("--preempt-start", args.preempt_start),
    )


def _port(args: argparse.Namespace) -> list[str]:
    # Checked (a port in use, too) with the rest of the config, before anything is written.
    return [] if args.metrics_port is None else [f"metrics.port={args.metrics_port}"]


def train_command(args: argparse.Namespace) -> int:
    from vcdl import api

    _check_chaos(args)
    home = writable_home(args.home)
    room_for_run(home)  # before a built-in data set is made, or Prefect starts
    run_name = checked_name("--run", args.run, "run")
    loaded = load_config(args.config, [*args.overrides, *_port(args)])
    if run_name is not None:
        loaded = loaded.updated(run={"name": run_name})
    _check_log(home, loaded)
    cfg = api.resolve(loaded, workers=args.workers, home=home)
    return _run(args, cfg, home)


def resume_command(args: argparse.Namespace) -> int:
    from vcdl import api

    _check_chaos(args)
    home = writable_home(args.home)
    room_for_run(home)  # before a built-in data set is made, or Prefect starts
    recorded = api.recorded_config(args.run, home=args.home, ledger_url=args.ledger)
    _check_log(home, recorded)
    cfg = api.resolve(recorded, workers=args.workers, overrides=_port(args), home=home)
    return _run(args, cfg, home)


def _check_log(home: Path, cfg: RunConfig) -> None:
    """A folder, or a file vcdl cannot write, where the run's log goes: one line, before
    the preflight of :func:`vcdl.api.resolve` writes anything (a built-in data set)."""
    from vcdl.config_files import run_log_path
    from vcdl.display import check_run_log

    assert cfg.run.name is not None
    check_run_log(run_log_path(home, cfg.run.name))


def _run(args: argparse.Namespace, cfg: RunConfig, home: Path) -> int:
    from vcdl import api
    from vcdl.views.datasets import baseline_line
    from vcdl.worker.speed import speeds_label

    # What an interrupt's message names: `vcdl resume NAME` (see main).
    args.resumable = cfg.run.name
    assert cfg.run.name is not None
    # A run another driver is running: refused before Prefect or a cluster starts.
    api.check_not_driven(cfg)
    if cfg.cluster.address:
        # Before the run is recorded: a mistyped address or a scheduler not yet
        # up is one line now, not a traceback after the connect timeout.
        api.check_scheduler(cfg.cluster.address)
    api.prepare_prefect(home)
    assert cfg.run.name is not None and cfg.ledger.url is not None
    where = cfg.cluster.address or f"{cfg.cluster.workers} local workers"
    if cfg.cluster.speeds:
        where += f" ({speeds_label(cfg.cluster.speeds)})"
    print(
        f"vcdl: run {cfg.run.name}: {cfg.run.epochs} epochs × {cfg.data.shards} shards of "
        f"'{cfg.data.name}', model {cfg.model.factory}, on {where}; state in {home}",
        file=sys.stderr,
    )
    summary = api.run_on_terminal(
        cfg, home, chaos_of(args), verbose=args.verbose, command=args.command
    )
    print_summary(summary, args.json)
    if not args.json:
        baseline = baseline_line(cfg, summary)
        if baseline is not None:
            print(baseline)
    return 0 if summary["state"] == "completed" else 1
