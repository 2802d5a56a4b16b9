"""The Prefect tasks of an epoch: train one shard on a Dask worker, evaluate a version.

Thin: each passes a run reference and coordinates, never tensors, and calls
the library (:func:`vcdl.worker.attempt.run_attempt`,
:func:`vcdl.driver.runs.evaluate_version`). Safe to run twice: an attempt
for a subtask that is already merged is recorded and skipped.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.cluster import training_slots
from vcdl.config import RunConfig
from vcdl.driver.runs import evaluate_version
from vcdl.ledger import evaluation_metrics
from vcdl.runtime import RunRef
from vcdl.worker.admission import admitted, attempt_bytes, evaluation_bytes, worker_gate
from vcdl.worker.attempt import ShardData, load_shard, run_attempt, state_bytes, worker_name
from vcdl.worker.preemption import notice_received, preempted_result
from vcdl.worker.slots import training_slot


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
    # Imported here: the task function is pickled by value, and a module-level
    # threading.local would go with it (it cannot be pickled).
    from distributed.worker import thread_state

    body_started = time.time()
    # The worker's spare Dask thread gets here while its other task trains
    # (flows/cluster.py): read the rows meanwhile, wait for the slot, then
    # claim the freshest head.
    # Before the read-ahead: a new gate reads the process's baseline memory.
    gate = worker_gate(config.cluster.memory_admission)
    ahead = [prefetch_shard(ref, epoch, shard, config)]
    prefetched = time.time()
    need = _attempt_need(ref.run, ahead[0], config)
    with training_slot(training_slots(config)):
        slot_acquired = time.time()
        # An attempt that must wait for memory drops the model it read ahead
        # meanwhile (ahead.clear): waiting attempts hold nothing big.
        with admitted(gate, need, ahead.clear, stop=notice_received):
            admitted_at = time.time()
            if notice_received():
                # A worker under notice takes nothing new: the flow reissues
                # elsewhere. Returned, not raised: a raised exception is an ERROR
                # with a traceback in Prefect's log, and a pointless retry here.
                return preempted_result(worker_name())
            data = ahead[0] if ahead else None
            ahead.clear()
            out = run_attempt(
                ref, epoch, shard, base_version, notice_received, config, data
            ).to_dict()
            del data  # the model goes before the gate lets the next attempt in
    # Wall-clock marks (one machine's clock, or NTP-synced ones) that let the
    # driver split dispatch overhead into Dask scheduling and Prefect's engine.
    out["clock"] = {
        "dask_started": getattr(thread_state, "start_time", None),
        "body_started": body_started,
        "prefetched": prefetched,
        "slot_acquired": slot_acquired,
        "admitted": admitted_at,
        "body_ended": time.time(),
    }
    return out


# Per run, the model's bytes as this process last read them: the estimate for
# an attempt whose read-ahead failed, and for an evaluation (each builds its
# model inside the library call).
_MODEL_BYTES: dict[str, int] = {}


def _attempt_need(run: str, data: ShardData | None, config: RunConfig) -> int:
    """Estimated bytes of this attempt (:func:`vcdl.worker.admission.attempt_bytes`).

    0 (not gated) when neither this read-ahead nor an earlier one here read the model.
    """
    if data is not None:
        _MODEL_BYTES[run] = state_bytes(data.model.state_dict())
    t = config.train
    return attempt_bytes(
        _MODEL_BYTES.get(run, 0), t.optimizer, t.momentum, config.merge.result_precision
    )


def evaluation_need(run: str) -> int:
    """Estimated bytes of evaluating ``run`` here; 0 (not gated) until an attempt read its model."""
    return evaluation_bytes(_MODEL_BYTES.get(run, 0))


def prefetch_shard(ref: RunRef, epoch: int, shard: int, config: RunConfig) -> ShardData | None:
    """The subtask's rows and model read ahead, or None to let the attempt read them.

    Best effort: an attempt that reads them itself records a failure to do so
    in the ledger, against its claim, with the reason.
    """
    try:
        return load_shard(ref, epoch, shard, config)
    except Exception as exc:  # the attempt reads again, and records why it fails
        logging.getLogger(__name__).debug("prefetch of %s/%s failed: %s", epoch, shard, exc)
        return None


@task(
    name="evaluate", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE, persist_result=False
)
def evaluate_head(ref: RunRef, config: RunConfig, version: int, epoch: int) -> dict[str, Any]:
    """Evaluate a version on the test split by the run's objective; record it in the ledger."""
    gate = worker_gate(config.cluster.memory_admission)
    with admitted(gate, evaluation_need(ref.run), stop=notice_received):
        ev = evaluate_version(ref, config, version, epoch=epoch)
    return {
        "version": ev.version,
        "accuracy": ev.accuracy,
        "loss": ev.loss,
        "metrics": evaluation_metrics(ev),
        "samples": ev.samples,
    }
