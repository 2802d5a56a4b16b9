"""The ``vcdl-evaluate`` flow: evaluate any version of a run on a data set.

The evaluation is recorded in the ledger (as ``vcdl evaluate`` does) and shown
as a table artifact ``vcdl-<run>-eval-v<N>``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from prefect import get_run_logger
from pydantic import Field

from flows.guard import form_home, form_ledger_url
from flows.params import guarded_flow
from flows.reporting import publish_table
from vcdl.config_files import resolve_home
from vcdl.driver.runs import evaluate_version
from vcdl.ledger import evaluation_metrics
from vcdl.objectives import objective_for
from vcdl.runtime import run_ref
from vcdl.views.artifacts import artifact_key
from vcdl.views.epochs import format_metrics


@guarded_flow(name="vcdl-evaluate", persist_result=True)
def evaluate(
    run: Annotated[str, Field(description="Run name in the ledger.")],
    version: Annotated[int | None, Field(ge=0, description="Version; empty = head.")] = None,
    data: Annotated[str | None, Field(description="Data set; empty = the run's.")] = None,
    split: Annotated[Literal["train", "test"], Field(description="Split to evaluate on.")] = "test",
    home: Annotated[str | None, Field(description="vcdl home (default $VCDL_HOME)")] = None,
    ledger_url: Annotated[str | None, Field(description="Ledger URL; empty = under home.")] = None,
) -> dict[str, Any]:
    """Evaluate a version (default: the head) of ``run``; returns its metrics and samples."""
    # From a deployment's form: the deployment's home and ledger only, no credentials.
    ledger_url = form_ledger_url(ledger_url, form_home(home))
    ref = run_ref(run, resolve_home(home), ledger_url)
    cfg = ref.config()
    ev = evaluate_version(ref, cfg, version, split=split, dataset=data)
    out = {
        "run": run,
        "version": ev.version,
        "data": data or cfg.data.name,
        "split": split,
        "accuracy": ev.accuracy,
        "loss": ev.loss,
        **{k: v for k, v in evaluation_metrics(ev).items() if k not in ("accuracy", "loss")},
        "samples": ev.samples,
    }
    get_run_logger().info(
        "%s v%d on %s:%s: %s",
        run,
        ev.version,
        out["data"],
        split,
        format_metrics(evaluation_metrics(ev), objective_for(cfg.train).headline),
    )
    publish_table(
        artifact_key("vcdl", run, "eval", f"v{ev.version}"), [out], f"vcdl evaluate {run}"
    )
    return out
