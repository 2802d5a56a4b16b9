"""The Prefect tasks of an epoch: train one shard on a Dask worker, evaluate a version.

Thin: each passes a run reference and coordinates, never tensors, and calls
the library with the worker's runtime (:mod:`vcdl.worker.runtime`): read
ahead, a training slot, memory admission and the attempt are
:func:`vcdl.worker.readahead.train_admitted`; an evaluation is
:func:`vcdl.driver.runs.evaluate_version` under the same gate. What is kept
here is Prefect's: the tasks, their retries and their results. Safe to run
twice: an attempt for a subtask that is already merged is recorded and skipped.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.cluster import training_slots
from vcdl.config import RunConfig
from vcdl.driver.runs import evaluate_version
from vcdl.ledger import evaluation_metrics
from vcdl.runtime import RunRef
from vcdl.worker.readahead import evaluation_admitted, train_admitted
from vcdl.worker.runtime import WorkerRuntime, current_runtime


def task_runtime() -> WorkerRuntime:
    """The runtime of the Dask worker running this task; outside one (the driver's own
    evaluation, a test) a fresh one for this task alone."""
    return current_runtime() or WorkerRuntime()


# persist_result=False: results are small dicts the driver consumes at once;
# persisting them would write files on every (spot) worker.
@task(
    name="train-shard",
    retries=1,
    retry_delay_seconds=1,
    cache_policy=NO_CACHE,
    persist_result=False,
)
def train_shard(
    ref: RunRef, config: RunConfig, epoch: int, shard: int, base_version: int | None = None
) -> dict[str, Any]:
    """Train one attempt of (run, epoch, shard) on whichever worker runs this."""
    return train_admitted(
        task_runtime(), ref, config, epoch, shard, base_version, training_slots(config)
    )


@task(
    name="evaluate", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE, persist_result=False
)
def evaluate_head(ref: RunRef, config: RunConfig, version: int, epoch: int) -> dict[str, Any]:
    """Evaluate a version on the test split by the run's objective; record it in the ledger."""
    with evaluation_admitted(task_runtime(), ref.run, config.cluster.memory_admission):
        ev = evaluate_version(ref, config, version, epoch=epoch)
    return {
        "version": ev.version,
        "accuracy": ev.accuracy,
        "loss": ev.loss,
        "metrics": evaluation_metrics(ev),
        "samples": ev.samples,
    }
