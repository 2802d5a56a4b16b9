"""The deployments of vcdl, for ``vcdl serve`` (prefect.yaml declares the same for workers).

A flow run started from a deployment keeps the deployment's locations and
imports only what ``$VCDL_ALLOW_IMPORTS`` of the deployment's environment
allows (flows/guard.py).

Names and schedules match ``prefect.yaml``: ``vcdl-train/vcdl-train``,
``vcdl-retrain/vcdl-retrain`` (cron :data:`RETRAIN_CRON`, inactive until
enabled in the UI or with ``prefect deployment schedule resume``) and
``vcdl-evaluate/vcdl-evaluate``.
"""

from __future__ import annotations

import logging
from typing import Any

RETRAIN_CRON = "0 3 * * *"  # nightly, 03:00 UTC
RETRAIN_TIMEZONE = "UTC"
DEFAULT_PARENT = "mnist1d"  # the run `vcdl train examples/mnist1d.toml` creates
NAMES = ("vcdl-train/vcdl-train", "vcdl-retrain/vcdl-retrain", "vcdl-evaluate/vcdl-evaluate")


def deployments(home: str | None = None, parent: str = DEFAULT_PARENT) -> list[Any]:
    """RunnerDeployments of the train, retrain and evaluate flows (for ``prefect.serve``)."""
    from prefect.schedules import Cron

    from flows.evaluate import evaluate
    from flows.retrain import retrain
    from flows.train import train

    where = {"home": home} if home else {}
    return [
        train.to_deployment(
            name="vcdl-train",
            description="Train (or resume, by run name) a VC-ASGD run.",
            tags=["vcdl"],
            parameters=where,
        ),
        retrain.to_deployment(
            name="vcdl-retrain",
            description="Warm-start a new run from a parent run's head on the current data; "
            "skipped when the data set's fingerprint has not changed.",
            tags=["vcdl"],
            parameters={"parent": parent, **where},
            schedules=[Cron(RETRAIN_CRON, timezone=RETRAIN_TIMEZONE, active=False)],
        ),
        evaluate.to_deployment(
            name="vcdl-evaluate",
            description="Evaluate any version of a run on a data set.",
            tags=["vcdl"],
            parameters=where,
        ),
    ]


def serve(home: str | None = None, parent: str = DEFAULT_PARENT, limit: int | None = None) -> None:
    """Serve the deployments from this process until interrupted (no work pool needed).

    ``home`` becomes the deployments' own vcdl home (``$VCDL_HOME`` of the flow
    runs): a form may leave it empty or repeat it, not point elsewhere
    (flows/guard.py).
    """
    import os

    from prefect import serve as prefect_serve

    from vcdl.config_files import HOME_ENV

    if home:
        os.environ[HOME_ENV] = home

    prefect_serve(*deployments(home, parent), limit=limit)


def run_remote(
    name: str, parameters: dict[str, Any], timeout: float | None = None
) -> tuple[Any, dict[str, Any] | None]:
    """Start a deployment's flow run, wait for it; (flow run, its summary or None).

    The summary is the flow run's persisted result; it is None when the flow
    run did not finish within ``timeout`` or its result storage is not
    readable from here (then use ``vcdl status RUN --json``).
    """
    from prefect.deployments import run_deployment

    fr: Any = run_deployment(
        name=name, parameters=parameters, timeout=timeout, as_subflow=False
    )  # sync call: a FlowRun (the type also admits the async variant's coroutine)
    result = None
    if fr.state is not None and fr.state.is_completed():
        try:
            result = fr.state.result()
        except Exception as exc:
            logging.getLogger(__name__).warning(
                "result of flow run %s not readable here: %s: %s", fr.id, type(exc).__name__, exc
            )
            result = None
    return fr, result if isinstance(result, dict) else None
