"""Around each attempt on a worker: read ahead, wait for a training slot, then for memory.

What the shard task runs on its worker (:func:`train_admitted`): the
subtask's rows and model are read while the worker's other attempt still
trains, the attempt then waits for one of the worker's training slots
(:mod:`vcdl.worker.slots`) and for room in its memory
(:mod:`vcdl.worker.admission`), and trains, unless the worker has a
preemption notice. A pinned base (the task names its version) is read in
the background from the start, beside the rows, and the attempt hands its
slot on when its training ends and writes its result meanwhile
(:mod:`vcdl.worker.basecache`): no next attempt waits for that result. An
evaluation goes through the same gate (:func:`evaluation_admitted`). The
estimates use the model's bytes as an attempt of the run last read them
here, kept in the worker's runtime (:mod:`vcdl.worker.runtime`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from vcdl.config import RunConfig
from vcdl.runtime import RunRef
from vcdl.worker.admission import admitted, attempt_bytes, evaluation_bytes
from vcdl.worker.attempt import run_attempt, state_bytes, worker_name
from vcdl.worker.basecache import overlap_enabled
from vcdl.worker.baseread import start_base_read
from vcdl.worker.preemption import preempted_result
from vcdl.worker.runtime import WorkerRuntime
from vcdl.worker.shard_data import ShardData, load_shard

log = logging.getLogger(__name__)


def prefetch_shard(ref: RunRef, epoch: int, shard: int, config: RunConfig) -> ShardData | None:
    """The subtask's rows and model read ahead, or None to let the attempt read them.

    Best effort: an attempt that reads them itself records a failure to do so
    in the ledger, against its claim, with the reason.
    """
    try:
        return load_shard(ref, epoch, shard, config)
    except Exception as exc:  # the attempt reads again, and records why it fails
        log.debug("prefetch of %s/%s failed: %s", epoch, shard, exc)
        return None


def prefetch_base(
    ref: RunRef, runtime: WorkerRuntime, version: int | None, epoch: int, shard: int
) -> None:
    """Start reading a pinned base version in the background, kept for the attempt.

    Best effort, like :func:`prefetch_shard`: a failed read is not kept, and
    the attempt reads again and records why it fails. Nothing for a head read
    at claim time (``version`` None), or with overlaps off.
    """
    if version is None or not overlap_enabled():
        return
    try:
        start_base_read(ref, runtime, version, True, True, (ref.run, epoch, shard))
    except Exception as exc:  # the ledger's row: the attempt asks again
        log.debug("prefetch of base version %s failed: %s", version, exc)


def attempt_need(
    runtime: WorkerRuntime, run: str, data: ShardData | None, config: RunConfig
) -> int:
    """Estimated bytes of this attempt (:func:`vcdl.worker.admission.attempt_bytes`).

    0 (not gated) when neither this read-ahead nor an earlier one here read the model.
    """
    if data is not None:
        runtime.model_bytes[run] = state_bytes(data.model.state_dict())
    t = config.train
    return attempt_bytes(
        runtime.model_bytes.get(run, 0), t.optimizer, t.momentum, config.merge.result_precision
    )


def evaluation_need(runtime: WorkerRuntime, run: str) -> int:
    """Estimated bytes of evaluating ``run`` here; 0 (not gated) until an attempt read its model."""
    return evaluation_bytes(runtime.model_bytes.get(run, 0))


def train_admitted(
    runtime: WorkerRuntime,
    ref: RunRef,
    config: RunConfig,
    epoch: int,
    shard: int,
    base_version: int | None,
    slots: int | None,
) -> dict[str, Any]:
    """Read ahead, hold a training slot and memory, and run one attempt; its outcome as a dict.

    ``slots``: the attempts the worker trains at once (None: no limit). A
    worker under notice takes nothing new: it returns
    :func:`~vcdl.worker.preemption.preempted_result`. The outcome carries wall-clock
    marks (``clock``) that let the driver split dispatch overhead into Dask
    scheduling and Prefect's engine.
    """
    # Imported here: cloudpickle takes a task's module by value where it is
    # not importable on the worker, and a threading.local would go with it.
    from distributed.worker import thread_state

    body_started = time.time()
    runtime.watch_cloud(config.fault.cloud_notices, config.fault.notice_poll_seconds)
    # The worker's spare Dask thread gets here while its other task trains
    # (flows/cluster.py): read the rows meanwhile, wait for the slot, then
    # claim the freshest head.
    # Before the read-ahead: a new gate reads the process's baseline memory.
    gate = runtime.gate(config.cluster.memory_admission)
    prefetch_base(ref, runtime, base_version, epoch, shard)  # under way while rows are read
    ahead = [prefetch_shard(ref, epoch, shard, config)]
    prefetched = time.time()
    need = attempt_need(runtime, ref.run, ahead[0], config)
    with runtime.slots.hold(slots) as release:
        slot_acquired = time.time()
        # An attempt that must wait for memory drops the model it read ahead
        # meanwhile (ahead.clear): waiting attempts hold nothing big.
        with admitted(gate, need, ahead.clear, stop=runtime.notice_received):
            admitted_at = time.time()
            if runtime.notice_received():
                # A worker under notice takes nothing new: the flow reissues
                # elsewhere. Returned, not raised: a raised exception is an ERROR
                # with a traceback in Prefect's log, and a pointless retry here.
                return preempted_result(worker_name())
            data = ahead[0] if ahead else None
            ahead.clear()
            out = run_attempt(
                ref,
                epoch,
                shard,
                base_version,
                runtime.notice_received,
                config,
                data,
                runtime=runtime,
                # A pinned base: the next attempt waits for no merge of this result.
                trained=release if base_version is not None else None,
            ).to_dict()
            del data  # the model goes before the gate lets the next attempt in
    # Wall-clock marks (one machine's clock, or NTP-synced ones).
    out["clock"] = {
        "dask_started": getattr(thread_state, "start_time", None),
        "body_started": body_started,
        "prefetched": prefetched,
        "slot_acquired": slot_acquired,
        "admitted": admitted_at,
        "body_ended": time.time(),
    }
    return out


@contextmanager
def evaluation_admitted(runtime: WorkerRuntime, run: str, fraction: float) -> Iterator[float]:
    """Hold an evaluation's estimated bytes in the worker's gate; yields the seconds waited."""
    gate = runtime.gate(fraction)
    with admitted(gate, evaluation_need(runtime, run), stop=runtime.notice_received) as waited:
        yield waited
