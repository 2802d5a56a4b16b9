"""The driver's side of ``vcdl fleet check``: what to ask, and every worker's answer.

This module owns the I/O on the driver: :func:`probe_spec` turns a run's
config into the plain dict the probe takes (the store and ledger locations,
the run's import paths and its own modules zipped, as ``flows/cluster.py``
ships them) and the :class:`~vcdl.fleetcheck.verdict.Needs` the verdict
checks against; :func:`gather` connects to the scheduler, lists its
workers, measures each one's clock (:mod:`vcdl.fleetcheck.clock`) and runs
:func:`vcdl.fleetcheck.probe.probe` on all of them at once, each bounded by
a timeout: a worker that does not answer is reported, never waited on.
"""

from __future__ import annotations

import asyncio
import base64
import platform
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vcdl.errors import ConfigError
from vcdl.fleetcheck.clock import estimate
from vcdl.fleetcheck.verdict import Needs

if TYPE_CHECKING:
    from distributed import Client

    from vcdl.config import RunConfig

#: Clock samples per worker; the tightest is kept.
CLOCK_SAMPLES = 3


def driver_versions() -> dict[str, str]:
    """vcdl, torch and Python here: what every worker must match.

    torch's from its installed metadata: importing it would cost the driver
    seconds for a string (the workers report ``torch.__version__``, the same).
    """
    from importlib.metadata import PackageNotFoundError, version

    import vcdl

    try:
        torch = version("torch")
    except PackageNotFoundError:
        import torch as module

        torch = str(module.__version__)
    return {"vcdl": str(vcdl.__version__), "torch": torch, "python": platform.python_version()}


def run_config(
    path: str, overrides: Sequence[str] = (), home: str | None = None, ledger: str | None = None
) -> RunConfig:
    """The run config a check is about, resolved as ``vcdl train`` resolves it, minus the
    preflight (which may write a built-in data set): empty locations under ``home``, the
    modules beside the config allowed, each import path checked against the allowance."""
    from vcdl.config_files import load_config, resolve_home
    from vcdl.errors import ModelError
    from vcdl.usercode import check_allowed, grant_beside_config

    cfg = load_config(path, overrides)
    if ledger:
        cfg = cfg.updated(ledger={"url": ledger})
    cfg = cfg.with_locations(resolve_home(home))
    paths = _import_paths(cfg)
    grant_beside_config(paths, cfg.run.code_dir)
    # The driver ships only code it may import itself (docs/design.md §7), as
    # vcdl.runcode.run_check decides, but without importing vcdl.models (and
    # torch with it, seconds on a small driver): vcdl's own modules are its
    # built-ins, the rest needs $VCDL_ALLOW_IMPORTS or to be beside the config.
    checks = [
        (cfg.model.factory, "model factory", ModelError),
        (cfg.train.objective, "objective", ConfigError),
        (cfg.train.metrics, "metrics", ConfigError),
    ]
    for spec, what, error in checks:
        if spec in paths:
            builtins = {spec: spec} if spec.startswith("vcdl.") else {}
            check_allowed(spec, what=what, builtins=builtins, error=error)
    return cfg


def _import_paths(cfg: RunConfig) -> list[str]:
    """The run's import paths, as :func:`vcdl.runcode.run_specs` gives them (built-in names
    are no paths)."""
    specs = (cfg.model.factory, cfg.train.objective, cfg.train.metrics)
    return [s for s in specs if s is not None and ":" in s]


def probe_spec(cfg: RunConfig | None, timeout: float) -> tuple[dict[str, Any], Needs, float]:
    """The probe's request for ``cfg`` (None: no run, so no store, ledger or code), what the
    verdict needs of a worker, and how long a probe may take on a worker.

    Each part of a probe gets most of ``timeout``; the rest is left for the
    answer to come back.
    """
    part = max(1.0, timeout * 0.75)
    spec: dict[str, Any] = {"part_timeout": part, "code": {"timeout": part, "specs": []}}
    if cfg is None:
        return spec, Needs(), part
    spec["store"] = {"url": cfg.store.url, "storage_options": dict(cfg.store.storage_options)}
    spec["ledger"] = {"url": cfg.ledger.url}
    spec["code"] = {"timeout": part, **_code(cfg)}
    needs = Needs(store=True, ledger=True, code=True, cuda=cfg.train.device == "cuda")
    return spec, needs, part


def _code(cfg: RunConfig) -> dict[str, Any]:
    """The run's import paths, the modules the driver allows, its own modules as a zip."""
    from vcdl.usercode import bundle, code_dirs, local_modules, split_path

    paths = _import_paths(cfg)
    # A built-in model is a name; its import path inside vcdl is checked too.
    specs = paths if ":" in cfg.model.factory else [cfg.model.factory, *paths]
    grants = sorted({p[0] for s in paths if (p := split_path(s)) is not None})
    modules = local_modules(paths, code_dirs(cfg.run.code_dir))
    archive = None
    if modules:
        with tempfile.TemporaryDirectory(prefix="vcdl-fleet-check-") as tmp:
            zipped = bundle(modules, Path(tmp))
            archive = base64.b64encode(zipped.read_bytes()).decode("ascii")
    return {"specs": specs, "grants": grants, "archive": archive}


def gather(address: str, spec: dict[str, Any], timeout: float) -> list[dict[str, Any]]:
    """Every worker's report (unjudged), by worker name, then address.

    Raises :class:`ConfigError` (one line) when no scheduler answers at
    ``address``.
    """
    _reachable(address, timeout)
    return asyncio.run(_gather(address, spec, timeout))


def _reachable(address: str, timeout: float) -> None:
    from vcdl.config import scheduler_address_problem
    from vcdl.reach import no_scheduler, scheduler_unreachable

    problem = scheduler_address_problem(address)
    if problem:
        raise ConfigError(f"bad scheduler address {address[:200]!r}: {problem}")
    unreachable = scheduler_unreachable(address, min(timeout, 20.0))
    if unreachable:
        raise ConfigError(no_scheduler(address, f"({unreachable})"))


async def _gather(address: str, spec: dict[str, Any], timeout: float) -> list[dict[str, Any]]:
    from distributed import Client

    from vcdl.reach import no_scheduler

    try:
        client = await Client(address, asynchronous=True, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise ConfigError(
            no_scheduler(address, f"within {timeout:.0f} s ({type(exc).__name__})")
        ) from None
    try:
        identity = await client.scheduler.identity(n_workers=-1)
        workers: dict[str, Any] = dict(identity.get("workers") or {})
        reports = await asyncio.gather(
            *(_one(client, addr, info, spec, timeout) for addr, info in workers.items())
        )
        return sorted(reports, key=lambda r: (r["name"], r["address"]))
    finally:
        await client.close()


async def _one(
    client: Client, address: str, info: dict[str, Any], spec: dict[str, Any], timeout: float
) -> dict[str, Any]:
    """One worker's report: its clock first (an idle worker answers fastest), then the probe."""
    from vcdl.fleetcheck.probe import now, probe

    report: dict[str, Any] = {
        "address": address,
        "name": str(info.get("name", address)),
        "host": info.get("host"),
        "answered": False,
        "error": None,
        "clock": None,
    }
    deadline = time.monotonic() + timeout
    try:
        samples = []
        for _ in range(CLOCK_SAMPLES):
            sent = time.time()
            got = await asyncio.wait_for(
                client.run(now, workers=[address]), max(0.1, deadline - time.monotonic())
            )
            samples.append((sent, float(got[address]), time.time()))
        report["clock"] = estimate(samples)
        answers = await asyncio.wait_for(
            client.run(probe, spec, workers=[address], on_error="return"),
            max(0.1, deadline - time.monotonic()),
        )
    except TimeoutError:
        report["error"] = f"did not answer within {timeout:g} s"
        return report
    except Exception as exc:  # the worker left, or its comm broke, meanwhile
        report["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        return report
    answer = answers.get(address)
    if isinstance(answer, BaseException):
        # The probe could not run there: most often a vcdl without this module.
        report["error"] = f"the probe failed: {type(answer).__name__}: {str(answer)[:300]}"
        return report
    report.update(answer, answered=True)
    return report
