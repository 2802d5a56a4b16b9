"""The Python API: train, resume and inspect runs from code.

Example::

    from vcdl.api import train, load_config

    cfg = load_config("examples/mnist1d.toml", overrides=["run.epochs=3"])
    summary = train(cfg, run_name="mnist1d-a", workers=2)
    print(summary["test_accuracy"], summary["head_version"])

``train`` validates the config, the data set and the model before anything
is written to the ledger, then runs the ``vcdl-train`` Prefect flow in this
process (Prefect's ephemeral API unless ``PREFECT_API_URL`` is set) and
returns the same summary ``vcdl status RUN --json`` prints.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from vcdl.commands import (  # re-exported: the API's names since before the split
    check_chaos,
    check_scheduler,
    collect_garbage,
    data_store,
    import_dataset,
    make_dataset,
    run_cost,
    run_on_terminal,
)
from vcdl.config import RunConfig, format_error, parse_config
from vcdl.config_files import apply_overrides, load_config, resolve_home
from vcdl.errors import ConfigError
from vcdl.runtime import (
    RunRef,
    existing_ledger,
    recorded_config,
    run_ref,
)

if TYPE_CHECKING:
    from vcdl.replay.diff import RunDiff
    from vcdl.replay.replayer import Progress as ReplayProgress
    from vcdl.replay.runner import ReplayReport
    from vcdl.replay.whatif import WhatIfReport

__all__ = [
    "allow_own_code",
    "check_chaos",
    "check_not_driven",
    "check_scheduler",
    "collect_garbage",
    "data_store",
    "diff",
    "existing_ledger",
    "import_dataset",
    "load_config",
    "make_dataset",
    "preflight",
    "prepare_prefect",
    "recorded_config",
    "replay",
    "resolve",
    "resume",
    "run",
    "run_cost",
    "run_on_terminal",
    "run_ref",
    "status",
    "train",
    "what_if",
]


def prepare_prefect(home: Path) -> None:
    """Keep Prefect's state under the vcdl home when the user has no Prefect setup.

    Must run before ``prefect`` is imported; a user's own ``PREFECT_*``
    settings or profile always win. Prefect's temporary API server, when one
    is needed, then starts out of the terminal's Ctrl-C and stops with this
    process (:mod:`flows.workarounds.api_server`). A home on a disk without room
    for Prefect's database is refused first (:func:`vcdl.diskfull.room_for_run`).
    """
    from vcdl.diskfull import room_for_run

    room_for_run(home)
    _prefect_home(home)
    from flows.workarounds.api_server import install

    install()


def _prefect_home(home: Path) -> None:
    # The ephemeral server's telemetry would call out of offline machines and
    # trips "database is locked" in its SQLite file; a user's setting wins.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect waits 20 s for its ephemeral server; a busy 2-core machine
    # (workers importing torch) needs longer, and failing a run for it is silly.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    configured = any(
        k in os.environ for k in ("PREFECT_API_URL", "PREFECT_HOME", "PREFECT_PROFILE")
    )
    if not configured and not (Path.home() / ".prefect" / "profiles.toml").exists():
        os.environ["PREFECT_HOME"] = str(home / "prefect")
    if os.environ.get("PREFECT_HOME"):
        # Prefect makes its home without parents: under a directory that does
        # not exist yet, it warned, and its temporary server died in a long
        # traceback (SQLite could not open its file). An error here is Prefect's to report.
        with contextlib.suppress(OSError):
            Path(os.environ["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)


def resolve(
    config: RunConfig | str | Path,
    *,
    run_name: str | None = None,
    workers: int | None = None,
    overrides: Sequence[str] = (),
    home: str | Path | None = None,
) -> RunConfig:
    """The run's whole config, checked before anything is written.

    ``config`` is a :class:`RunConfig` or a TOML file; ``overrides`` are
    ``section.key=value`` strings; ``run_name`` and ``workers`` replace
    ``run.name`` and ``cluster.workers``; empty locations resolve under
    ``home``. Then the preflight: the data set (built-ins are generated), the
    model factory and the instance prices, so that bad input fails here
    with one line, before the ledger is touched.

    The caller is trusted as the config's author: the run's own modules
    beside its config file (``run.code_dir``; for a config made in Python
    without one, the current directory) may be imported, besides what
    ``$VCDL_ALLOW_IMPORTS`` allows (docs/design.md §7). A Prefect form never
    comes this way: the ``vcdl-train`` flow allows only the environment's list.
    """
    if isinstance(config, RunConfig):
        cfg = parse_config(apply_overrides(config.model_dump(), overrides)) if overrides else config
    else:
        cfg = load_config(config, overrides)
    if run_name is not None:
        # An empty name is refused by the config's check, not taken for "no name".
        cfg = cfg.updated(run={"name": run_name})
    elif cfg.run.name is None:
        # A config made in Python without a name: named as the flow names one.
        from datetime import UTC, datetime

        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        cfg = cfg.updated(run={"name": f"{cfg.data.name}-{stamp}"})
    if workers:
        cfg = cfg.updated(cluster={"workers": workers})
    cfg = cfg.with_locations(resolve_home(home))
    allow_own_code(cfg)
    preflight(cfg)
    return cfg


def allow_own_code(cfg: RunConfig) -> None:
    """Let this process import the run's own modules beside its config (a trusted caller's).

    For the CLI and this API only, never for a Prefect form: grants the
    modules of the run's import paths found in ``run.code_dir`` (else the
    current directory) and makes them importable here.
    """
    from vcdl.runcode import run_specs
    from vcdl.usercode import code_dirs, grant_beside_config, importable_here

    specs = run_specs(cfg.model.factory, cfg.train.objective, cfg.train.metrics)
    if grant_beside_config(specs, cfg.run.code_dir):
        importable_here(code_dirs(cfg.run.code_dir), specs)


def preflight(cfg: RunConfig) -> None:
    """Fail on a missing data set, shards or a batch that do not fit its training rows,
    a broken model factory or objective, a data set the objective cannot use, an
    unpriced instance type or a metrics port in use, before the ledger is written; a
    ledger that is someone else's database, or whose run a live driver holds, before
    anything is written (a built-in data set is made here)."""
    from vcdl.driver.runs import check_sizes, ensure_dataset, new_model
    from vcdl.metrics.exporter import check_endpoint
    from vcdl.models.factory import resolve_factory
    from vcdl.objectives import objective_for
    from vcdl.reach import local_resources_problem
    from vcdl.runcode import run_check, run_specs
    from vcdl.usercode import code_dirs, importable_here
    from vcdl.views.prices import run_prices

    # Before anything is imported: only what the operator (or the config's
    # author, through the CLI or this API) allows.
    check_endpoint(cfg.metrics)  # a metrics port in use
    # Resources no local worker offers: every shard task would wait forever.
    problem = local_resources_problem(cfg.cluster)
    if problem is not None:
        raise ConfigError(problem)
    run_check(cfg.model.factory, cfg.train.objective, cfg.train.metrics, grants=True)
    run_prices(cfg.cost)
    # The run's own modules (beside its config, or here) import in this process too.
    specs = run_specs(cfg.model.factory, cfg.train.objective, cfg.train.metrics)
    importable_here(code_dirs(cfg.run.code_dir), specs)
    objective = objective_for(cfg.train, cfg.data.fields)
    # The model factory's module, imported before the first write: one that fails or
    # exits when imported is refused with nothing written (a built-in data set was).
    resolve_factory(cfg.model.factory)
    # The ledger, read before the first write (a built-in data set): someone else's
    # database, or a run another driver holds, is refused with nothing written.
    check_not_driven(cfg)
    ref = RunRef.from_config(cfg)
    info = ensure_dataset(ref.store(), cfg)
    check_sizes(cfg, info)
    objective.check(info.fields)
    new_model(cfg, info)


def train(
    config: RunConfig | str | Path,
    *,
    run_name: str | None = None,
    workers: int | None = None,
    overrides: Sequence[str] = (),
    home: str | Path | None = None,
    chaos: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Train (or resume) a run and return its summary (see :func:`status`).

    ``chaos`` turns on the preemption simulator for this run, e.g.
    ``{"rate": 0.2, "notice_fraction": 0.25, "grace": 2, "seed": 1}`` (see
    :class:`flows.train.ChaosSpec`).

    Called at the top level of a script outside ``if __name__ ==
    "__main__":``, it refuses to start (a LocalCluster's workers import the
    script again and would start the run again, each of them).
    """
    from vcdl.usercode import unguarded_script_call

    where = unguarded_script_call()
    if where is not None:
        raise ConfigError(
            f"vcdl's train or resume is called at the top level of the script ({where}): "
            "the cluster's workers import the script again and would start runs of their "
            'own; put the call under `if __name__ == "__main__":`'
        )
    cfg = resolve(config, run_name=run_name, workers=workers, overrides=overrides, home=home)
    return run(cfg, home=home, chaos=chaos)


def run(
    cfg: RunConfig, *, home: str | Path | None = None, chaos: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Run the ``vcdl-train`` flow for a config :func:`resolve` returned; its summary."""
    check_not_driven(cfg)
    home_path = resolve_home(home)
    prepare_prefect(home_path)
    from flows.train import ChaosSpec
    from flows.train import train as train_flow

    try:
        spec = ChaosSpec.model_validate(dict(chaos)) if chaos else None
    except ValidationError as exc:
        # The API's own one-line error, as for the config: not a pydantic traceback.
        raise ConfigError(f"invalid chaos: {format_error(exc)}") from None
    return train_flow(config=cfg, home=str(home_path), chaos=spec)


def check_not_driven(cfg: RunConfig) -> None:
    """:class:`~vcdl.errors.RunBeingDriven` (exit 2) when a live driver runs ``cfg``'s run
    already: before Prefect or a cluster starts for a second one."""
    from vcdl.driver.lease import refuse_live_driver

    if cfg.run.name is not None and cfg.ledger.url is not None:  # resolve() sets both
        refuse_live_driver(cfg.ledger.url, cfg.run.name)


def resume(
    name: str,
    *,
    home: str | Path | None = None,
    ledger_url: str | None = None,
    workers: int | None = None,
    chaos: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Continue a run from the ledger's state with its recorded config."""
    cfg = recorded_config(name, home=home, ledger_url=ledger_url)
    return train(cfg, workers=workers, home=home, chaos=chaos)


def status(
    name: str, home: str | Path | None = None, ledger_url: str | None = None
) -> dict[str, Any]:
    """The run's summary: state, epochs, head, test accuracy, per-epoch history."""
    from vcdl.views.status import run_status

    return run_status(existing_ledger(home, ledger_url), name)


def replay(
    name: str,
    home: str | Path | None = None,
    ledger_url: str | None = None,
    *,
    first: int = 0,
    last: int | None = None,
    progress: ReplayProgress | None = None,
    keep_going: bool | None = None,
) -> ReplayReport:
    """Re-execute run ``name``'s versions after ``first`` up to ``last`` on this CPU and
    compare each with the record (vcdl.replay; docs/replay.md)."""
    from vcdl.replay.runner import replay_run

    ref = run_ref(name, home, ledger_url)
    return replay_run(ref, first=first, last=last, progress=progress, keep_going=keep_going)


def what_if(
    name: str,
    new_name: str,
    reject: str | None = None,
    home: str | Path | None = None,
    ledger_url: str | None = None,
    *,
    alpha: float | None = None,
    rule: str | None = None,
    first: int | None = None,
    progress: ReplayProgress | None = None,
) -> WhatIfReport:
    """Re-execute run ``name`` into run ``new_name`` with one change: without attempt
    ``reject``'s merge, or merged with α ``alpha`` (constant) and/or rule ``rule`` from
    version ``first`` on (docs/replay.md)."""
    from vcdl.replay.whatif import what_if as into

    return into(
        run_ref(name, home, ledger_url),
        new_name,
        reject=reject,
        alpha=alpha,
        rule=rule,
        first=first,
        progress=progress,
    )


def diff(
    name: str, other: str, home: str | Path | None = None, ledger_url: str | None = None
) -> RunDiff:
    """Where runs ``name`` and ``other`` part, and both heads' test metrics."""
    from vcdl.replay.diff import diff_runs

    return diff_runs(run_ref(name, home, ledger_url), run_ref(other, home, ledger_url))
