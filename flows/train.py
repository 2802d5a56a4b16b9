"""The ``vcdl-train`` flow: a run's epochs, each an epoch subflow of shard tasks on Dask.

Reads as a plain sequence: prepare (create or resume) the run, start or
connect to the Dask cluster, then for each remaining epoch run the epoch
subflow, whose shard tasks execute on ``prefect_dask.DaskTaskRunner`` while
the flow process merges results as they complete and evaluates the head at
the epoch's end. The ledger, not Prefect's state, decides what is left to do,
so running the flow again with the same run name resumes where it stopped.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import torch
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture, as_completed
from prefect_dask import DaskTaskRunner

from flows.cluster import dask_cluster
from vcdl.assimilator import HeadCache, merge_attempt
from vcdl.attempt import TERMINAL_SUBTASK_STATES, run_attempt
from vcdl.config import RunConfig, resolve_home
from vcdl.report import run_status
from vcdl.runs import clean_orphans, evaluate_version, prepare_run
from vcdl.runtime import RunRef


@task(name="train-shard", retries=1, retry_delay_seconds=2, cache_policy=NO_CACHE)
def train_shard(
    ref: RunRef, config: RunConfig, epoch: int, shard: int, base_version: int | None = None
) -> dict[str, Any]:
    """Train one attempt of (run, epoch, shard) on whichever worker runs this."""
    return run_attempt(ref, epoch, shard, base_version, config=config).to_dict()


@task(name="evaluate", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def evaluate_head(ref: RunRef, config: RunConfig, version: int, epoch: int) -> dict[str, Any]:
    """Evaluate a version on the test split and record it in the ledger."""
    ev = evaluate_version(ref, config, version, epoch=epoch)
    return {"version": ev.version, "accuracy": ev.accuracy, "loss": ev.loss, "samples": ev.samples}


def _epoch_start_version(ref: RunRef, epoch: int) -> int:
    """The version every shard of an epoch starts from under the average rule."""
    ledger = ref.ledger()
    merged = [v.number for v in ledger.versions(ref.run) if v.epoch == epoch]
    return min(merged) - 1 if merged else ledger.get_run(ref.run).head_version


@flow(name="vcdl-epoch")
def epoch_flow(ref: RunRef, config: RunConfig, epoch: int) -> dict[str, Any]:
    """Run every unfinished shard of one epoch and merge each result as it lands."""
    logger = get_run_logger()
    ledger = ref.ledger()
    cfg = config
    subtasks = ledger.ensure_subtasks(ref.run, epoch, cfg.data.shards)
    base = _epoch_start_version(ref, epoch) if cfg.merge.rule == "average" else None
    cache = HeadCache()
    tally = {"merged": 0, "duplicate": 0, "rejected": 0, "skipped": 0, "errors": 0, "reissued": 0}
    pending: dict[PrefectFuture[dict[str, Any]], int] = {}
    submitted: dict[int, int] = {}

    def submit(shard: int) -> None:
        submitted[shard] = submitted.get(shard, 0) + 1
        fut = train_shard.with_options(
            task_run_name=f"epoch {epoch} · shard {shard} · attempt {submitted[shard]}",
            tags=[f"run:{ref.run}", f"epoch:{epoch}"],
        ).submit(ref, cfg, epoch, shard, base)
        pending[fut] = shard

    def reissue(shard: int, reason: str) -> None:
        sub = next(s for s in ledger.subtasks(ref.run, epoch) if s.shard == shard)
        if sub.state in TERMINAL_SUBTASK_STATES:
            return
        if sub.attempts >= cfg.fault.max_attempts:
            assert sub.id is not None
            ledger.set_subtask_state(
                sub.id, "failed", reason=f"{sub.attempts} attempts, last: {reason}"
            )
            logger.error("epoch %d shard %d failed for good: %s", epoch, shard, reason)
            return
        tally["reissued"] += 1
        logger.warning("epoch %d shard %d reissued: %s", epoch, shard, reason)
        submit(shard)

    for sub in subtasks:
        if sub.state not in TERMINAL_SUBTASK_STATES:
            submit(sub.shard)
    started = time.perf_counter()
    while pending:
        # as_completed over a set that grows with reissues: take one, re-wait.
        fut = next(as_completed(list(pending)))
        shard = pending.pop(fut)
        try:
            out = fut.result()
        except Exception as exc:
            tally["errors"] += 1
            reissue(shard, f"{type(exc).__name__}: {exc}")
            continue
        if out["state"] == "skipped":
            tally["skipped"] += 1
            continue
        outcome = merge_attempt(ref, str(out["attempt_id"]), cfg, cache)
        tally[outcome.kind] += 1
        if outcome.kind == "rejected":
            reissue(shard, outcome.reason or "rejected")
        elif outcome.kind == "merged":
            logger.info(
                "epoch %d shard %d merged as v%s (alpha %.3f, staleness %s, loss %.4f)",
                epoch,
                shard,
                outcome.version,
                outcome.alpha or 0.0,
                outcome.staleness,
                out["loss"] or float("nan"),
            )
    head = ledger.get_run(ref.run).head_version
    ev = evaluate_head.with_options(tags=[f"run:{ref.run}"]).submit(ref, cfg, head, epoch).result()
    ledger.update_run(ref.run, epochs_completed=epoch + 1)
    logger.info(
        "epoch %d done in %.1fs: head v%d, test accuracy %.4f",
        epoch,
        time.perf_counter() - started,
        head,
        ev["accuracy"],
    )
    return {"epoch": epoch, "head_version": head, **tally, "test_accuracy": ev["accuracy"]}


def _named(config: RunConfig) -> RunConfig:
    if config.run.name:
        return config
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return config.updated(run={"name": f"{config.data.name}-{stamp}"})


@flow(name="vcdl-train")
def train(config: RunConfig, home: str | None = None) -> dict[str, Any]:
    """Train (or resume) the run described by ``config``; returns its status summary."""
    logger = get_run_logger()
    # The flow process only merges (memory-bound); the cores are the workers'.
    torch.set_num_threads(1)
    cfg = _named(config).with_locations(resolve_home(home))
    ref, run, resumed = prepare_run(cfg)
    ledger = ref.ledger()
    if resumed:
        removed = clean_orphans(ref)
        logger.info(
            "resuming run %s at epoch %d, head v%d (%d orphan groups removed)",
            ref.run,
            run.epochs_completed,
            run.head_version,
            len(removed),
        )
    ledger.update_run(ref.run, state="running")
    try:
        with dask_cluster(cfg) as address:
            runner = DaskTaskRunner(address=address)
            for epoch in range(run.epochs_completed, cfg.run.epochs):
                epoch_flow.with_options(
                    task_runner=runner,  # type: ignore[arg-type]  # DaskTaskRunner is one
                    flow_run_name=f"{ref.run} · epoch {epoch}",
                )(ref, cfg, epoch)
    except BaseException:
        ledger.update_run(ref.run, state="failed")
        raise
    ledger.update_run(ref.run, state="completed")
    summary = run_status(ledger, ref.run)
    create_markdown_artifact(
        key=f"vcdl-summary-{ref.run}".lower().replace("_", "-").replace(".", "-"),
        markdown=_summary_markdown(summary),
        description=f"vcdl run {ref.run}",
    )
    return summary


def _summary_markdown(s: dict[str, Any]) -> str:
    lines = [
        f"# vcdl run `{s['run']}`",
        "",
        f"State **{s['state']}**, {s['epochs_completed']}/{s['epochs']} epochs, "
        f"head v{s['head_version']}, test accuracy {s['test_accuracy']}.",
        "",
        "| epoch | merged | attempts | version | mean staleness | test accuracy |",
        "|---|---|---|---|---|---|",
    ]
    for h in s["history"]:
        lines.append(
            f"| {h['epoch']} | {h['merged']}/{h['subtasks']} | {h['attempts']} | "
            f"v{h['version']} | {h['mean_staleness']} | {h['test_accuracy']} |"
        )
    lines += ["", f"Export: `vcdl export {s['run']} --out model.safetensors`"]
    return "\n".join(lines)
