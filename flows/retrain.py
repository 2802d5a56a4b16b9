"""The ``vcdl-retrain`` flow: warm-start a new run from a parent run on current data.

Scheduled (nightly, inactive until enabled) or on demand. Reads as a sequence:

1. find the *source*: the newest completed run in the parent's warm-start
   lineage (the parent itself the first time; later the previous retrain),
   so nightly retrains chain;
2. compare the data set's fingerprint now with the one recorded in the
   source's v0 attributes (``data_fingerprint``, written by
   :func:`vcdl.driver.runs.prepare_run`); equal → return a ``skipped`` summary
   (the flow run is Completed), unless ``force``;
3. create the new run with the source's chosen version (head, best test
   accuracy, or a number) written as its v0 bit for bit, the parent link in
   the ledger (``run.parent_run``/``parent_version``) and the new fingerprint
   in v0's attributes;
4. train it with the ``vcdl-train`` flow (a subflow);
5. emit ``vcdl.retrain.accuracy-dropped`` when its test accuracy is below
   ``min_accuracy`` (an objective with accuracy), or ``vcdl.retrain.loss-rose``
   when its test loss is above ``max_loss``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from prefect import get_run_logger
from pydantic import Field

from flows.guard import form_home, form_ledger_url
from flows.params import guarded_flow
from flows.reporting import data_fingerprint, emit
from flows.train import train
from vcdl.config_files import resolve_home
from vcdl.driver.retrain import latest_descendant, pick_version, retrain_decision
from vcdl.driver.runs import ensure_dataset, load_version, prepare_run
from vcdl.errors import LedgerNotFound, RunNotFound
from vcdl.objectives import objective_for
from vcdl.runtime import existing_ledger, run_ref


@guarded_flow(name="vcdl-retrain", persist_result=True)
def retrain(
    parent: Annotated[str, Field(description="Run to warm-start from (its lineage is followed).")],
    data: Annotated[
        str | None, Field(description="Data set to train on; empty = the parent's.")
    ] = None,
    version: Annotated[
        int | Literal["head", "best"],
        Field(description="Version of the source run to start from: head, best or a number."),
    ] = "head",
    epochs: Annotated[
        int | None, Field(ge=1, description="Epochs of the new run; empty = the parent's.")
    ] = None,
    run_name: Annotated[
        str | None, Field(description="Name of the new run; empty = <parent>-r<UTC time>.")
    ] = None,
    follow_lineage: Annotated[
        bool, Field(description="Start from the newest completed retrain of the parent.")
    ] = True,
    force: Annotated[bool, Field(description="Retrain even if the data has not changed.")] = False,
    min_accuracy: Annotated[
        float | None,
        Field(ge=0, le=1, description="Emit vcdl.retrain.accuracy-dropped below this."),
    ] = None,
    max_loss: Annotated[
        float | None,
        Field(ge=0, description="Emit vcdl.retrain.loss-rose above this test loss."),
    ] = None,
    home: Annotated[str | None, Field(description="vcdl home (default $VCDL_HOME)")] = None,
    ledger_url: Annotated[str | None, Field(description="Ledger URL; empty = under home.")] = None,
) -> dict[str, Any]:
    """Warm-start a new run from ``parent`` on the current data; skip if the data is unchanged."""
    log = get_run_logger()
    # From a deployment's form: the deployment's home and ledger only, no credentials.
    ledger_url = form_ledger_url(ledger_url, form_home(home))
    home_path = resolve_home(home)
    try:
        ledger = existing_ledger(home_path, ledger_url)
    except LedgerNotFound as exc:  # the parent cannot exist: say so as for a missing run
        emit("vcdl.retrain.failed", parent, {"error": str(exc)})
        raise
    source = latest_descendant(ledger.list_runs(), parent) if follow_lineage else None
    if source is None:
        source = ledger.find_run(parent)
    if source is None:
        emit("vcdl.retrain.failed", parent, {"error": f"run {parent!r} not found"})
        raise RunNotFound(f"run {parent!r} not found in ledger {ledger.display_url}")
    src_ref = run_ref(source.name, home_path, ledger.url)
    src_cfg = src_ref.config()
    data_name = data or src_cfg.data.name
    cfg = src_cfg.updated(data={"name": data_name})
    info = ensure_dataset(src_ref.store(), cfg)
    previous = data_fingerprint(src_ref)
    # The source's fingerprint only speaks for the data set it was trained on.
    if src_cfg.data.name != data_name:
        previous = None if previous is None else f"{src_cfg.data.name}:{previous}"
    decision = retrain_decision(info.fingerprint, previous, force)
    base = {"parent_run": source.name, "data": data_name, "fingerprint": info.fingerprint}
    if decision.skip:
        log.info("retrain of %s skipped: %s", source.name, decision.reason)
        emit("vcdl.retrain.skipped", source.name, {**base, "reason": decision.reason})
        return {"state": "skipped", "reason": decision.reason, "run": None, **base}
    objective = objective_for(src_cfg.train)
    number = pick_version(
        version,
        source.head_version,
        ledger.evaluations(source.name),
        metric=objective.headline,
        higher_is_better=objective.higher_is_better,
    )
    _, state = load_version(src_ref, number)
    name = run_name or f"{parent}-r{datetime.now(UTC):%Y%m%d-%H%M%S}"
    new_cfg = cfg.updated(run={"name": name, "epochs": epochs or src_cfg.run.epochs})
    log.info(
        "retraining: %s from %s v%d on %s (%s)",
        name,
        source.name,
        number,
        data_name,
        decision.reason,
    )
    prepare_run(new_cfg, init_state=state, parent=(source.name, number))
    summary = train(config=new_cfg, home=str(home_path))
    acc, loss = summary.get("test_accuracy"), summary.get("test_loss")
    payload = {
        **base,
        "run": name,
        "parent_version": number,
        "test_accuracy": acc,
        "test_metrics": summary.get("test_metrics") or {},
    }
    # Accuracy where the objective has one; loss for every objective.
    if min_accuracy is not None and (acc is None or acc < min_accuracy):
        log.warning("retrained run %s: accuracy %s below %s", name, acc, min_accuracy)
        emit("vcdl.retrain.accuracy-dropped", name, {**payload, "min_accuracy": min_accuracy})
    elif max_loss is not None and (loss is None or loss > max_loss):
        log.warning("retrained run %s: test loss %s above %s", name, loss, max_loss)
        emit("vcdl.retrain.loss-rose", name, {**payload, "max_loss": max_loss})
    else:
        emit("vcdl.retrain.completed", name, payload)
    return {**summary, "reason": decision.reason, "fingerprint": info.fingerprint}
