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

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vcdl.config import RunConfig, apply_overrides, load_config, parse_config, resolve_home
from vcdl.ledger import Ledger
from vcdl.runtime import RunRef, open_ledger

__all__ = ["load_config", "resume", "run_ref", "status", "train"]


def prepare_prefect(home: Path) -> None:
    """Keep Prefect's state under the vcdl home when the user has no Prefect setup.

    Must run before ``prefect`` is imported; a user's own ``PREFECT_*``
    settings or profile always win.
    """
    # The ephemeral server's telemetry would call out of offline machines and
    # trips "database is locked" in its SQLite file; a user's setting wins.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect waits 20 s for its ephemeral server; a busy 2-core machine
    # (workers importing torch) needs longer, and failing a run for it is silly.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    if any(k in os.environ for k in ("PREFECT_API_URL", "PREFECT_HOME", "PREFECT_PROFILE")):
        return
    if (Path.home() / ".prefect" / "profiles.toml").exists():
        return
    os.environ["PREFECT_HOME"] = str(home / "prefect")


def _resolve(
    config: RunConfig | str | Path,
    run_name: str | None,
    workers: int | None,
    overrides: Sequence[str],
    home: Path,
) -> RunConfig:
    if isinstance(config, RunConfig):
        cfg = parse_config(apply_overrides(config.model_dump(), overrides)) if overrides else config
    else:
        cfg = load_config(config, overrides)
    if run_name:
        cfg = cfg.updated(run={"name": run_name})
    if workers:
        cfg = cfg.updated(cluster={"workers": workers})
    return cfg.with_locations(home)


def preflight(cfg: RunConfig) -> None:
    """Fail on a missing data set, a broken model factory or an unpriced instance type
    before the ledger is touched."""
    from vcdl.cost import run_prices
    from vcdl.runs import ensure_dataset, new_model

    run_prices(cfg.cost)
    ref = RunRef.from_config(cfg)
    info = ensure_dataset(ref.store(), cfg)
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
    """
    home_path = resolve_home(home)
    cfg = _resolve(config, run_name, workers, overrides, home_path)
    preflight(cfg)
    prepare_prefect(home_path)
    from flows.train import ChaosSpec
    from flows.train import train as train_flow

    spec = ChaosSpec.model_validate(dict(chaos)) if chaos else None
    return train_flow(config=cfg, home=str(home_path), chaos=spec)


def run_ref(name: str, home: str | Path | None = None, ledger_url: str | None = None) -> RunRef:
    """The reference of an existing run, its store taken from its recorded config."""
    ledger = _ledger(home, ledger_url)
    cfg = RunConfig.model_validate_json(ledger.get_run(name).config)
    assert cfg.store.url is not None  # recorded configs have resolved locations
    return RunRef(
        run=name,
        ledger_url=ledger.url,
        store_url=cfg.store.url,
        storage_options=dict(cfg.store.storage_options),
    )


def resume(
    name: str,
    *,
    home: str | Path | None = None,
    ledger_url: str | None = None,
    workers: int | None = None,
    chaos: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Continue a run from the ledger's state with its recorded config."""
    ledger = _ledger(home, ledger_url)
    cfg = RunConfig.model_validate_json(ledger.get_run(name).config)
    return train(cfg, workers=workers, home=home, chaos=chaos)


def status(
    name: str, home: str | Path | None = None, ledger_url: str | None = None
) -> dict[str, Any]:
    """The run's summary: state, epochs, head, test accuracy, per-epoch history."""
    from vcdl.report import run_status

    return run_status(_ledger(home, ledger_url), name)


def default_ledger_url(home: str | Path | None = None) -> str:
    return f"sqlite:///{resolve_home(home) / 'ledger.db'}"


def _ledger(home: str | Path | None, ledger_url: str | None) -> Ledger:
    """An existing ledger, for commands that read runs (LedgerNotFound if there is none)."""
    url = ledger_url or os.environ.get("VCDL_LEDGER_URL") or default_ledger_url(home)
    return open_ledger(url, create=False)
