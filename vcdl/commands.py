"""What the ``vcdl`` commands do besides running and inspecting runs (:mod:`vcdl.api`).

A scheduler address and the preemption simulator's options checked before
anything starts (one line saying what is wrong), a run on the terminal as
``vcdl train`` runs it (its log file, the live display), the cost report,
one pass of the retention policy (``vcdl gc``, under the run's lease), and
the data sets of ``vcdl data``. :mod:`vcdl.api` re-exports every name, as
they were its own before it was split. Heavy imports stay inside the
functions: ``vcdl --help`` imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vcdl.config import RunConfig
from vcdl.config_files import resolve_home
from vcdl.errors import ConfigError
from vcdl.runtime import RunRef, existing_ledger, recorded_config

if TYPE_CHECKING:
    from vcdl.data import DatasetInfo
    from vcdl.driver.gc import GcReport
    from vcdl.store import WeightStore

__all__ = [
    "GC_LEASE_TTL",
    "check_chaos",
    "check_scheduler",
    "collect_garbage",
    "data_store",
    "import_dataset",
    "make_dataset",
    "run_cost",
    "run_on_terminal",
]

#: Seconds :func:`collect_garbage` holds the run's lease between renewals (a killed gc
#: is waited out this long).
GC_LEASE_TTL = 10.0


def check_scheduler(address: str, timeout: float = 20.0) -> None:
    """A Dask scheduler answers at ``address``, or one line saying what is wrong with it."""
    from vcdl.config import scheduler_address_problem
    from vcdl.reach import no_scheduler, scheduler_unreachable

    problem = scheduler_address_problem(address)
    if problem:
        raise ConfigError(f"bad scheduler address {address[:200]!r}: {problem}")
    from vcdl.dask_tls import client_tls_problem, handshake_refused

    problem = client_tls_problem(address)
    if problem:
        raise ConfigError(problem)
    unreachable = scheduler_unreachable(address, timeout)
    if unreachable:
        raise ConfigError(no_scheduler(address, f"({unreachable})"))
    from distributed import Client

    try:
        with Client(address, timeout=timeout, set_as_default=False):
            pass
    except (OSError, TimeoutError) as exc:
        refused = handshake_refused(address, exc)
        if refused:
            raise ConfigError(refused) from None
        detail = f"within {timeout:.0f} s ({type(exc).__name__})"
        raise ConfigError(no_scheduler(address, detail)) from None


def check_chaos(
    rate: tuple[str, float],
    notices: tuple[str, float],
    grace: tuple[str, float],
    duration: tuple[str, float] | None = None,
    start: tuple[str, float] | None = None,
) -> None:
    """Simulator options, each (flag, value), in range, or one line naming the flag."""
    import math

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


def run_on_terminal(
    cfg: RunConfig,
    home: Path,
    chaos: Mapping[str, Any] | None,
    *,
    verbose: bool,
    command: str,
) -> dict[str, Any]:
    """:func:`run`, as ``vcdl train`` runs it: its log in the run's log file, its progress
    on the terminal (Prefect's own lines too with ``verbose``); ``command`` names it in the log.
    """
    import sys
    import time

    from vcdl.api import run
    from vcdl.config_files import run_log_path
    from vcdl.display import Display, RunLog, out_is_terminal
    from vcdl.views import observe

    assert cfg.run.name is not None  # resolve() names every run
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
                    summary = run(cfg, home=home, chaos=chaos)
            finally:
                runlog.keep_terminal = display.stuck  # closing it would wait too
    finally:
        _quiet_prefect(verbose)
    return summary


def _quiet_prefect(verbose: bool) -> None:
    """Keep Prefect's INFO lines off the terminal once the run's log is closed.

    The run itself writes them to its log file (vcdl/display.py); what Prefect
    logs after that (its temporary server stopping, at exit) would reach the
    terminal, where only ``-v`` shows Prefect's own lines.
    """
    if verbose:
        return
    import logging

    # Prefect's logging config attaches its console handler to the root logger
    # and to uvicorn's and fastapi's; quiet them all, keep the API handlers.
    loggers = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict)]
    for logger in [logging.root, *loggers]:
        for handler in getattr(logger, "handlers", []):
            if type(handler).__name__ == "PrefectConsoleHandler":
                handler.setLevel(logging.WARNING)


def run_cost(
    name: str,
    *,
    instance: str | None = None,
    prices: str | None = None,
    home: str | Path | None = None,
    ledger_url: str | None = None,
) -> dict[str, Any]:
    """The run's cost report (``vcdl cost``): its ``[cost]`` settings, ``instance`` (the
    type of every worker) and ``prices`` (a TOML file of prices) replacing theirs."""
    from vcdl.views.cost import run_cost_report

    ledger = existing_ledger(home, ledger_url)
    cost = recorded_config(name, ledger=ledger).cost
    given = {"instance_type": instance, "prices": prices}
    cost = cost.model_copy(update={k: v for k, v in given.items() if v is not None})
    if instance is not None:
        cost = cost.model_copy(update={"worker_types": {}})  # "every worker" means every
    return run_cost_report(ledger, name, cost)


def collect_garbage(ref: RunRef, *, dry_run: bool = False) -> GcReport:
    """Apply the run's retention policy (``store.keep``) once: ``vcdl gc``."""
    from vcdl.driver.gc import collect
    from vcdl.driver.lease import run_lease

    # Never beside a live driver (it prunes as it merges, and may be evaluating
    # a version this pass would let go): gc holds the run's lease while it deletes.
    if dry_run:
        return collect(ref, ref.config(), dry_run=True)
    with run_lease(ref, ttl=GC_LEASE_TTL) as lease:
        # Fenced: a gc paused past its lease deletes nothing once a driver took over.
        leased = ref.leased(lease.generation)
        return collect(leased, leased.config(), dry_run=False)


def data_store(url: str | None, home: str | Path | None = None) -> WeightStore:
    """The store of ``vcdl data``: ``url``, else ``<home>/store``."""
    from vcdl.runtime import open_store

    return open_store(url or str(resolve_home(home) / "store"))


def make_dataset(
    store: WeightStore,
    kind: str,
    *,
    name: str | None = None,
    samples: int = 40_000,
    context: int = 128,
) -> DatasetInfo:
    """Generate a built-in data set (``digits``, ``mnist1d``, ``pytext``), named ``kind``
    unless ``name`` is given; ``samples`` for mnist1d, ``context`` for pytext."""
    from vcdl import data

    name = name or kind
    if kind == "digits":
        return data.make_digits(store, name=name)
    if kind == "pytext":
        return data.make_pytext(store, name=name, context=context)
    return data.make_mnist1d(store, name=name, samples=samples)


def import_dataset(
    store: WeightStore,
    file: str | Path,
    name: str,
    *,
    format: str = "auto",
    test_fraction: float | None = None,
    classes: int | None = None,
    context: int = 128,
    pattern: str = "*.txt",
) -> DatasetInfo:
    """Import an ``.npz``, a Parquet/Arrow table or text (a file or folder) as data set ``name``.

    ``format`` ``auto`` goes by the file's extension (text otherwise);
    ``test_fraction`` defaults to 0.1 for text, 0.2 otherwise.
    """
    from vcdl import data

    path = Path(file)
    kind = format
    if kind == "auto":
        suffix = path.suffix.lower()
        kind = {".npz": "npz", ".parquet": "table", ".arrow": "table", ".feather": "table"}.get(
            suffix, "text"
        )
    if test_fraction is None:
        test_fraction = 0.1 if kind == "text" else 0.2
    if kind == "npz":
        return data.import_npz(store, path, name, num_classes=classes, test_fraction=test_fraction)
    if kind == "table":
        return data.import_table(
            store, path, name, num_classes=classes, test_fraction=test_fraction
        )
    return data.import_text(
        store, path, name, context=context, test_fraction=test_fraction, pattern=pattern
    )
