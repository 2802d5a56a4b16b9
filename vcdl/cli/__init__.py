"""The ``vcdl`` command line: parses, calls the library or a flow, prints. No logic.

Exit codes: 0 success, 1 failure at run time (or audit violations), 2 bad
input (config, data set, model, unknown run), 130 interrupted (Ctrl-C), 143
terminated (SIGTERM: a spot notice, ``docker stop``; :mod:`vcdl.termination`).

Longer than ~500 lines on purpose: one parser and one thin printer per
command, read side by side; a package per command is the next CLI change.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from vcdl.chaos import DEFAULT_START
from vcdl.cli.json_output import JSON_OPTION, emit, error_document, json_mode, report, wants_json
from vcdl.config import resolve_home
from vcdl.errors import ConfigError, VcdlError
from vcdl.termination import TERMINATED_EXIT, Terminated, sigterm_as_interrupt

#: Seconds `vcdl gc` holds the run's lease between renewals (a killed gc is waited out this long).
GC_LEASE_TTL = 10.0


class _UsageError(Exception):
    """Bad command line; :func:`main` says so as text or as JSON."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.message, self.usage = message, usage


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message, self.format_usage())


def _fail(message: str, code: int, as_json: bool = False, kind: str = "Error") -> NoReturn:
    from vcdl.redact import redact_text

    # Any URL in the message is shown redacted, wherever the error came from, and
    # on one line: a driver's message (psycopg's, say) may span several.
    shown = " ".join(line.strip() for line in redact_text(message).splitlines() if line.strip())
    if as_json:
        print(error_document(kind, shown, code), file=sys.stderr)
    else:
        print(f"vcdl: error: {shown}", file=sys.stderr)
    raise SystemExit(code)


def _parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument(
        "--home", help="state directory (default: $VCDL_HOME or ./.vcdl)", default=None
    )
    common.add_argument(
        "--ledger", help="ledger URL for existing runs (default: sqlite under --home)"
    )
    # A command that reports takes json_opt and hands its document to report().
    json_opt = _Parser(add_help=False, parents=[JSON_OPTION])
    p = _Parser(prog="vcdl", description="VC-ASGD training on preemptible machines.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    chaos_opts = _Parser(add_help=False)
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
        parents=[common, chaos_opts, json_opt],
        help="train (or resume) a run from a TOML config",
    )
    t.add_argument("config", help="run config (TOML), e.g. examples/mnist1d.toml")
    t.add_argument("--run", help="run name (default: run.name, else the file name)")
    t.add_argument("--workers", type=int, help="LocalCluster worker processes")
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
        parents=[common, chaos_opts, json_opt],
        help="continue a run from the ledger's state",
    )
    r.add_argument("run")
    r.add_argument("--workers", type=int)
    r.add_argument("-v", "--verbose", action="store_true")
    for parser in (t, r):
        parser.add_argument(
            "--metrics-port",
            type=int,
            metavar="PORT",
            help="serve the run's Prometheus metrics on PORT (metrics.port; see metrics.address)",
        )

    c = sub.add_parser(
        "chaos", parents=[json_opt], help="preempt the workers of a running Dask cluster"
    )
    c.add_argument("scheduler", help="scheduler address, e.g. tcp://127.0.0.1:8786")
    c.add_argument("--rate", type=float, required=True, help="events per second (Poisson)")
    c.add_argument("--duration", type=float, required=True, help="seconds to run")
    c.add_argument("--notices", type=float, default=0.25, help="fraction of events with notice")
    c.add_argument("--grace", type=float, default=2.0, help="seconds from notice to kill")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--log", help="JSON-lines file of every event")

    reporting = [common, json_opt]
    sub.add_parser("runs", parents=reporting, help="list runs")

    s = sub.add_parser("status", parents=reporting, help="a run's state and history")
    s.add_argument("run")

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

    e = sub.add_parser("export", parents=reporting, help="write a version as .safetensors or .pt")
    e.add_argument("run")
    e.add_argument("--version", type=int, help="version number (default: head)")
    e.add_argument("--out", required=True, help="output file (.safetensors or .pt)")
    e.add_argument("--force", action="store_true", help="replace --out if it exists")

    ev = sub.add_parser("evaluate", parents=reporting, help="evaluate a version on a data set")
    ev.add_argument("run")
    ev.add_argument("--version", type=int)
    ev.add_argument("--data", help="data set name (default: the run's)")
    ev.add_argument("--split", default="test", choices=["train", "test"])

    sv = sub.add_parser(
        "serve",
        parents=[common],
        help="serve the vcdl-train, vcdl-retrain and vcdl-evaluate deployments from this "
        "process (one machine, no work pool)",
    )
    sv.add_argument(
        "--parent", default="mnist1d", help="vcdl-retrain's default parent run (default: mnist1d)"
    )
    sv.add_argument("--limit", type=int, help="flow runs at a time (default: no limit)")

    d = sub.add_parser("data", help="data sets in the store")
    dsub = d.add_subparsers(dest="data_command", required=True, parser_class=_Parser)
    store_opt = _Parser(add_help=False, parents=reporting)
    store_opt.add_argument("--store", help="store URL (default: <home>/store)")
    mk = dsub.add_parser("make", parents=[store_opt], help="generate a built-in data set")
    mk.add_argument("kind", choices=["digits", "mnist1d", "pytext"])
    mk.add_argument("--name", help="data set name (default: the kind)")
    mk.add_argument("--samples", type=int, default=40_000, help="mnist1d samples")
    mk.add_argument(
        "--context", type=int, default=128, help="pytext: tokens of context per row (128)"
    )
    im = dsub.add_parser(
        "import",
        parents=[store_opt],
        help="import an .npz of named arrays, a Parquet/Arrow table, or text (bytes as tokens)",
    )
    im.add_argument("file", help=".npz, .parquet/.arrow/.feather, or a text file or folder")
    im.add_argument("--name", required=True)
    im.add_argument(
        "--format",
        choices=["auto", "npz", "table", "text"],
        default="auto",
        help="what the file is (default: by its extension; text otherwise)",
    )
    im.add_argument(
        "--test-fraction",
        type=float,
        default=None,
        help="held-out share when the input names no splits (npz, table: 0.2; text: 0.1)",
    )
    im.add_argument("--classes", type=int, help="number of classes (classification x, y)")
    im.add_argument("--context", type=int, default=128, help="text: tokens of context per row")
    im.add_argument("--pattern", default="*.txt", help="text folder: files to read (*.txt)")
    dsub.add_parser("list", parents=[store_opt], help="list data sets")

    comp = sub.add_parser(
        "completion",
        help="print a shell completion script, e.g. `vcdl completion bash > ~/.vcdl.bash`",
    )
    comp.add_argument("shell", choices=["bash", "zsh", "fish"])
    return p


def _quiet_prefect(verbose: bool) -> None:
    """Keep Prefect's INFO lines off the terminal once the run's log is closed.

    The run itself writes them to its log file (vcdl/display.py); what Prefect
    logs after that (its temporary server stopping, at exit) would reach the
    terminal, where only ``-v`` shows Prefect's own lines.
    """
    if verbose:
        return
    # Prefect's logging config attaches its console handler to the root logger
    # and to uvicorn's and fastapi's; quiet them all, keep the API handlers.
    loggers = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict)]
    for logger in [logging.root, *loggers]:
        for handler in getattr(logger, "handlers", []):
            if type(handler).__name__ == "PrefectConsoleHandler":
                handler.setLevel(logging.WARNING)


def _print_summary(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit(summary)
        return
    import shutil

    from vcdl.views.summary import summary_lines

    # A terminal's width; a pipe's lines are left long (but for the phases).
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    print("\n".join(summary_lines(summary, width)))


def _check_scheduler(address: str, timeout: float = 20.0) -> None:
    """A Dask scheduler answers at ``address``, or one line saying what is wrong with it."""
    from vcdl.config import scheduler_address_problem
    from vcdl.reach import no_scheduler, scheduler_unreachable

    problem = scheduler_address_problem(address)
    if problem:
        raise ConfigError(f"bad scheduler address {address[:200]!r}: {problem}")
    unreachable = scheduler_unreachable(address, timeout)
    if unreachable:
        raise ConfigError(no_scheduler(address, f"({unreachable})"))
    from distributed import Client

    try:
        with Client(address, timeout=timeout, set_as_default=False):
            pass
    except (OSError, TimeoutError) as exc:
        detail = f"within {timeout:.0f} s ({type(exc).__name__})"
        raise ConfigError(no_scheduler(address, detail)) from None


def _check_chaos(
    rate: tuple[str, float],
    notices: tuple[str, float],
    grace: tuple[str, float],
    duration: tuple[str, float] | None = None,
    start: tuple[str, float] | None = None,
) -> None:
    """Simulator options, each (flag, value), in range, or one line naming the flag."""
    from vcdl.chaos import MAX_GRACE, MAX_RATE, MAX_START

    checks = [
        (*rate, 0.0, MAX_RATE, "events per second"),
        (*notices, 0.0, 1.0, "a fraction"),
        (*grace, 0.0, MAX_GRACE, "seconds"),
    ]
    if duration is not None:
        checks.append((*duration, 1e-3, 7 * 86400.0, "seconds"))
    if start is not None:
        checks.append((*start, 0.0, MAX_START, "seconds"))
    for flag, value, low, high, what in checks:
        if not (math.isfinite(value) and low <= value <= high):
            raise ConfigError(f"{flag} must be {what} from {low:g} to {high:g} (got {value:g})")


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


def _train(args: argparse.Namespace) -> int:
    from vcdl import api

    _check_chaos(
        ("--preempt", args.preempt),
        ("--preempt-notices", args.preempt_notices),
        ("--preempt-grace", args.preempt_grace),
        start=("--preempt-start", args.preempt_start),
    )
    home = resolve_home(args.home)
    # Checked (a port in use, too) with the rest of the config, before anything is written.
    port = [] if args.metrics_port is None else [f"metrics.port={args.metrics_port}"]
    if args.command == "resume":
        recorded = api.recorded_config(args.run, home=args.home, ledger_url=args.ledger)
        cfg = api.resolve(recorded, workers=args.workers, overrides=port, home=home)
    else:
        cfg = api.resolve(
            args.config,
            run_name=args.run,
            workers=args.workers,
            overrides=[*args.overrides, *port],
            home=home,
        )
    # What an interrupt's message names: `vcdl resume NAME` (see main).
    args.resumable = cfg.run.name
    if cfg.cluster.address:
        # Before the run is recorded: a mistyped address or a scheduler not yet
        # up is one line now, not a traceback after the connect timeout.
        _check_scheduler(cfg.cluster.address)
    api.prepare_prefect(home)
    assert cfg.run.name is not None and cfg.ledger.url is not None
    where = cfg.cluster.address or f"{cfg.cluster.workers} local workers"
    print(
        f"vcdl: run {cfg.run.name}: {cfg.run.epochs} epochs × {cfg.data.shards} shards of "
        f"'{cfg.data.name}', model {cfg.model.factory}, on {where}; state in {home}",
        file=sys.stderr,
    )
    summary = _run_with_display(cfg, home, chaos_of(args), args.verbose, args.command)
    _print_summary(summary, args.json)
    if not args.json:
        _print_baseline(cfg, summary)
    return 0 if summary["state"] == "completed" else 1


def _run_with_display(
    cfg: Any, home: Any, chaos: dict[str, Any] | None, verbose: bool, command: str
) -> dict[str, Any]:
    """Run the flow with its log in the run's log file and its progress on the terminal."""
    from vcdl import api
    from vcdl.config import run_log_path
    from vcdl.display import Display, RunLog, out_is_terminal
    from vcdl.views import observe

    started = time.monotonic()
    path = run_log_path(home, cfg.run.name)
    live = out_is_terminal(sys.stderr)
    shown = "shown here too" if verbose else "-v shows it here"
    print(f"vcdl: log in {path} ({shown})", file=sys.stderr, flush=True)
    runlog = RunLog(path, f"vcdl {command} {cfg.run.name}")
    try:
        with runlog:
            display = Display(
                runlog.terminal, live, run=cfg.run.name, started=started, warnings=not verbose
            )
            if verbose:
                display.show_log(path, runlog.start_offset)
            try:
                with display, observe.listening(display.listen):
                    summary = api.run(cfg, home=home, chaos=chaos)
            finally:
                runlog.keep_terminal = display.stuck  # closing it would wait too
    finally:
        _quiet_prefect(verbose)
    return summary


def _print_baseline(cfg: Any, summary: dict[str, Any]) -> None:
    """A text run's test loss beside the text's unigram entropy (what context must beat)."""
    from vcdl.data import open_dataset
    from vcdl.errors import DataError
    from vcdl.runtime import open_store

    loss = (summary.get("test_metrics") or {}).get("loss")
    options = json.dumps(cfg.store.storage_options, sort_keys=True)
    try:
        stats = open_dataset(open_store(cfg.store.url, options), cfg.data.name).stats
    except DataError:
        return
    entropy = stats.get("unigram_entropy")
    if loss is None or entropy is None:
        return
    print(
        f"test loss {loss:.3f} nats/token; unigram entropy of '{cfg.data.name}' "
        f"{entropy:.3f} nats/token: {abs(entropy - loss):.3f} "
        + ("below it" if loss < entropy else "ABOVE it: the model learnt less than byte counts")
    )


def _data(args: argparse.Namespace) -> int:
    from vcdl import data
    from vcdl.runtime import open_store

    store = open_store(args.store or str(resolve_home(args.home) / "store"))
    if args.data_command == "make":
        name = args.name or args.kind
        if args.kind == "digits":
            info = data.make_digits(store, name=name)
        elif args.kind == "pytext":
            info = data.make_pytext(store, name=name, context=args.context)
        else:
            info = data.make_mnist1d(store, name=name, samples=args.samples)
    elif args.data_command == "import":
        info = _import(store, args)
    else:
        sets = data.list_datasets(store)
        if report(args, {"datasets": [_dataset_doc(store, d) for d in sets]}):
            return 0
        for d in sets:
            print(f"{d.name:20} {_describe(d)} ({d.source})")
        return 0
    if report(args, {"dataset": _dataset_doc(store, info)}):
        return 0
    print(f"data set {info.name}: {_describe(info)}, in {store.shown('datasets/' + info.name)}")
    return 0


def _dataset_doc(store: Any, info: Any) -> dict[str, Any]:
    """A data set as ``data list --json`` and ``data make/import --json`` print it."""
    return {
        "name": info.name,
        "source": info.source,
        "fingerprint": info.fingerprint,
        "format": info.format,
        "uri": store.shown("datasets/" + info.name),
        "rows": {name: split.rows for name, split in info.splits.items()},
        "fields": {
            f: {"dtype": a.dtype, "shape": list(a.shape)}
            for f, a in info.splits["train"].arrays.items()
        },
        "hints": {k: v for k, v in sorted(info.hints.items()) if v is not None},
        "stats": dict(sorted(info.stats.items())),
    }


def _import(store: Any, args: argparse.Namespace) -> Any:
    from pathlib import Path

    from vcdl import data

    path = Path(args.file)
    kind = args.format
    if kind == "auto":
        suffix = path.suffix.lower()
        kind = {".npz": "npz", ".parquet": "table", ".arrow": "table", ".feather": "table"}.get(
            suffix, "text"
        )
    if args.test_fraction is None:
        args.test_fraction = 0.1 if kind == "text" else 0.2
    if kind == "npz":
        return data.import_npz(
            store, path, args.name, num_classes=args.classes, test_fraction=args.test_fraction
        )
    if kind == "table":
        return data.import_table(
            store, path, args.name, num_classes=args.classes, test_fraction=args.test_fraction
        )
    return data.import_text(
        store,
        path,
        args.name,
        context=args.context,
        test_fraction=args.test_fraction,
        pattern=args.pattern,
    )


def _describe(info: Any) -> str:
    """``"3297 train / 366 test rows; tokens uint8 (129,); vocab_size 256, ..."``."""
    train = info.splits["train"]
    fields = ", ".join(f"{f} {a.dtype} {a.shape}" for f, a in train.arrays.items())
    hints = ", ".join(f"{k} {v}" for k, v in sorted(info.hints.items()) if v is not None)
    stats = ", ".join(f"{k} {v:.3f}" for k, v in sorted(info.stats.items()))
    return (
        f"{info.n_train} train / {info.n_test} test rows; {fields}"
        + (f"; {hints}" if hints else "")
        + (f"; {stats}" if stats else "")
    )


def _dispatch(args: argparse.Namespace) -> int:
    from vcdl import api

    if args.command in ("train", "resume"):
        return _train(args)
    if args.command == "data":
        return _data(args)
    if args.command == "completion":
        from vcdl.cli.completion import completion_script

        sys.stdout.write(completion_script(_parser(), args.shell))
        return 0
    if args.command == "serve":
        home = resolve_home(args.home)
        api.prepare_prefect(home)
        from flows.deployments import NAMES, RETRAIN_CRON, serve

        print(
            f"vcdl: serving {', '.join(NAMES)} (vcdl-retrain schedule '{RETRAIN_CRON}' UTC, "
            f"inactive until enabled); state in {home}; Ctrl-C stops",
            file=sys.stderr,
        )
        serve(home=str(home), parent=args.parent, limit=args.limit)
        return 0
    if args.command == "chaos":
        from vcdl.chaos import Preemptor, chaos_schedule

        _check_chaos(
            ("--rate", args.rate),
            ("--notices", args.notices),
            ("--grace", args.grace),
            ("--duration", args.duration),
        )
        _check_scheduler(args.scheduler)
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
    if args.command == "runs":
        from vcdl.errors import LedgerNotFound

        try:
            runs = api.existing_ledger(args.home, args.ledger).list_runs()
        except LedgerNotFound as exc:
            if not report(args, {"runs": [], "ledger_found": False}):
                print(f"no runs yet ({exc})")
            return 0
        if report(args, {"runs": [_run_doc(r) for r in runs], "ledger_found": True}):
            return 0
        if not runs:
            print("no runs yet: `vcdl train CONFIG` starts one")
        for r in runs:
            print(
                f"{r.name:30} {r.state:10} epochs {r.epochs_completed:>4} "
                f"head v{r.head_version:<6} {r.updated_at:%Y-%m-%d %H:%M}"
            )
        return 0
    if args.command == "cost":
        from vcdl.views.cost import format_cost, run_cost_report

        ledger = api.existing_ledger(args.home, args.ledger)
        cost = api.recorded_config(args.run, ledger=ledger).cost
        given = {"instance_type": args.instance, "prices": args.prices}
        cost = cost.model_copy(update={k: v for k, v in given.items() if v is not None})
        if args.instance is not None:
            cost = cost.model_copy(update={"worker_types": {}})  # "every worker" means every
        cost_report = run_cost_report(ledger, args.run, cost)
        if not report(args, cost_report):
            print(format_cost(cost_report))
        return 0
    if args.command == "status":
        _print_summary(api.status(args.run, args.home, args.ledger), args.json)
        return 0
    ref = api.run_ref(args.run, args.home, args.ledger)
    if args.command == "audit":
        from vcdl.views.audit import audit_run

        problems = audit_run(ref, deep=args.deep)
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
    if args.command == "gc":
        from vcdl.driver.gc import collect, format_report
        from vcdl.driver.lease import run_lease

        # Never beside a live driver (it prunes as it merges, and may be evaluating
        # a version this pass would let go): gc holds the run's lease while it deletes.
        with contextlib.nullcontext() if args.dry_run else run_lease(ref, ttl=GC_LEASE_TTL):
            gc = collect(ref, ref.config(), dry_run=args.dry_run)
        if not report(args, gc.to_dict()):
            print(format_report(gc))
        return 0
    if args.command == "export":
        from vcdl.driver.runs import export_version

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
    if args.command == "evaluate":
        from vcdl.driver.runs import evaluate_version
        from vcdl.ledger import evaluation_metrics
        from vcdl.views.epochs import format_metrics

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
    raise AssertionError(args.command)


def _run_doc(run: Any) -> dict[str, Any]:
    """A run as ``vcdl runs --json`` lists it."""
    from vcdl.config import RunConfig

    try:
        epochs: int | None = RunConfig.model_validate_json(run.config).run.epochs
    except ValueError:  # a config an older vcdl wrote: the listing still shows the run
        epochs = None
    return {
        "name": run.name,
        "state": run.state,
        "epochs": epochs,
        "epochs_completed": run.epochs_completed,
        "head_version": run.head_version,
        "parent_run": run.parent_run,
        "parent_version": run.parent_version,
        "created_at": run.created_at.isoformat(),
        "updated_at": run.updated_at.isoformat(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = wants_json(argv)
    try:
        args = _parser().parse_args(argv)
    except _UsageError as exc:
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
        _fail(str(exc), exc.exit_code, as_json, type(exc).__name__)
    except KeyboardInterrupt as exc:
        # Only a run has something to resume (`vcdl serve` or `vcdl chaos` do not).
        # Its name, once known: from the config (set by _train) or the command line.
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
        if not as_json:
            raise  # the traceback, as ever
        # A bug or an unforeseen failure: still one document, exit 1 as a traceback has.
        _fail(f"{type(exc).__name__}: {exc}", 1, True, type(exc).__name__)
    raise SystemExit(code)
