"""What a flow run started from a deployment (a Prefect form) may ask for.

The trust model (docs/design.md §7): a Prefect UI user filling a form is
trusted less than the operator who set the deployment up. A flow run started
from a deployment therefore

- imports only what ``$VCDL_ALLOW_IMPORTS`` in the deployment's environment
  allows (built-in models and objectives always), never the modules a
  trusted caller granted in some process (:func:`vcdl.usercode.grant`);
- keeps the deployment's locations: its vcdl home is ``$VCDL_HOME`` of the
  deployment's environment (``vcdl serve --home`` sets it), its store and
  ledger are the ones under that home; a form's ``home``, ``ledger_url``,
  ``store.url``, ``ledger.url``, ``run.code_dir`` and the preemption
  simulator's log file must be empty or name the same place, and the
  metrics endpoint listens on the loopback address only, unless the
  deployment's environment sets ``VCDL_FORM_LOCATIONS=1``;
- runs the preemption simulator (``chaos``, which kills the cluster's
  workers) only if the deployment's environment sets ``VCDL_ALLOW_CHAOS=1``;
- never takes a credential, whatever the deployment allows.

A flow called in Python (``vcdl train``, the API, a subflow such as the
retrain flow's training run) is not from a form: these checks do not apply,
and the caller's grants do.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vcdl.config import MetricsSection, RunConfig
from vcdl.config_files import resolve_home
from vcdl.errors import ConfigError
from vcdl.redact import url_secrets
from vcdl.runcode import run_check

FORM_LOCATIONS_ENV = "VCDL_FORM_LOCATIONS"
ALLOW_CHAOS_ENV = "VCDL_ALLOW_CHAOS"


def from_deployment() -> bool:
    """True if the current flow run was started from a deployment (its form), not called."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    return bool(ctx is not None and ctx.flow_run is not None and ctx.flow_run.deployment_id)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def form_locations_allowed() -> bool:
    """True if the deployment's environment lets a form choose where state lives."""
    return _env_flag(FORM_LOCATIONS_ENV)


def form_chaos_allowed() -> bool:
    """True if the deployment's environment lets a form turn on the preemption simulator."""
    return _env_flag(ALLOW_CHAOS_ENV)


def _refuse(what: str, home: Path) -> ConfigError:
    return ConfigError(
        f"{what}: a flow run from a deployment keeps the deployment's locations (home {home}); "
        f"leave it empty, or set {FORM_LOCATIONS_ENV}=1 in the deployment's environment"
    )


def _same(given: str, expected: str) -> bool:
    if "://" in given or "://" in expected:
        return given.rstrip("/") == expected.rstrip("/")
    return Path(given).expanduser().resolve() == Path(expected).expanduser().resolve()


def form_home(home: str | None) -> str | None:
    """The ``home`` a form gave, checked against the deployment's."""
    if home is None or not from_deployment() or form_locations_allowed():
        return home
    own = resolve_home(None)
    if resolve_home(home) != own:
        raise _refuse("home", own)
    return home


def form_ledger_url(url: str | None, home: str | None) -> str | None:
    """A ``ledger_url`` form parameter: never with credentials; else the deployment's."""
    if url is None or not from_deployment():
        return url
    found = url_secrets(url)
    if found:
        raise ConfigError(
            f"ledger_url must not contain credentials ({', '.join(found)}): flow parameters "
            "are shown in Prefect; set PGPASSWORD or use ~/.pgpass"
        )
    if form_locations_allowed():
        return url
    own = RunConfig().with_locations(resolve_home(home)).ledger.url
    assert own is not None
    if not _same(url, own):
        raise _refuse("ledger_url", resolve_home(None))
    return url


def check_train_form(config: RunConfig, home: str | None, chaos: Any) -> None:
    """Refuse what a ``vcdl-train`` form may not ask for (nothing when not from a deployment).

    Imports nothing: the import paths are checked against
    ``$VCDL_ALLOW_IMPORTS`` only, before the run is prepared.
    """
    if not from_deployment():
        return
    run_check(config.model.factory, config.train.objective, config.train.metrics, grants=False)
    if chaos is not None and bool(getattr(chaos, "rate", None)) and not form_chaos_allowed():
        # It kills the deployment's workers, runs of other users' included.
        raise ConfigError(
            "chaos: a flow run from a deployment may not turn on the preemption simulator "
            f"(it kills the cluster's workers); leave it empty, or set {ALLOW_CHAOS_ENV}=1 "
            "in the deployment's environment"
        )
    if form_locations_allowed():
        return
    form_home(home)
    own_home = resolve_home(None)
    own = RunConfig().with_locations(own_home)
    assert own.store.url is not None and own.ledger.url is not None
    if config.store.url and not _same(config.store.url, own.store.url):
        raise _refuse("store.url", own_home)
    if config.ledger.url and not _same(config.ledger.url, own.ledger.url):
        raise _refuse("ledger.url", own_home)
    if config.run.code_dir:
        raise _refuse("run.code_dir", own_home)
    if chaos is not None and getattr(chaos, "log", None):
        raise _refuse("chaos.log", own_home)
    loopback = MetricsSection().address
    if config.metrics.address != loopback:
        # Which interfaces the driver's machine listens on is the operator's call.
        raise ConfigError(
            f"metrics.address: a flow run from a deployment serves its metrics on {loopback} "
            f"only; set {FORM_LOCATIONS_ENV}=1 in the deployment's environment to let a form "
            "choose"
        )
