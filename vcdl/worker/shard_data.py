"""An attempt's shard: its training rows and a fresh model, read before the weights.

This module owns :func:`load_shard`: which rows subtask (run, epoch, shard)
trains on (the epoch's shard plan, even or sized by a throughput plan), how
they are read (decoded once per process and indexed in memory, or streamed
block by block when the split is larger than ``data.cache_mb``), and the
model and objective they train. Nothing here depends on the head, so a
worker's read-ahead stage (:mod:`vcdl.worker.readahead`) calls it while the
previous attempt still trains; :mod:`vcdl.worker.attempt` and the replay's
retraining (:mod:`vcdl.replay.retrain`) use the same rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from torch import nn

from vcdl.config import RunConfig
from vcdl.data import open_dataset, read_arrays, shard_indices, stream_rows
from vcdl.data.stream import ByteCounter, ShardStream
from vcdl.driver.throughput import planned_sizes, share_of
from vcdl.models import build_model
from vcdl.objectives import Objective, objective_for
from vcdl.runtime import RunRef


@dataclass
class ShardData:
    """What an attempt trains on apart from the weights: its rows and a fresh model."""

    key: tuple[str, int, int]
    """(run, epoch, shard) the rows belong to."""
    arrays: dict[str, np.ndarray] | ShardStream
    """The shard's rows, by field, in their stored dtypes; or, for a split larger than
    ``data.cache_mb``, a stream that reads them block by block as training goes."""
    model: nn.Module
    objective: Objective
    seconds: float
    """Time it took to read the rows and build the model."""
    counter: ByteCounter = field(default_factory=ByteCounter)
    """Bytes fetched from the store for these rows (a stream's grow as it is read)."""
    size_share: float | None = None
    """Under a throughput plan, the shard's rows over the epoch's mean shard's: what
    its result weighs in the merge (:func:`vcdl.driver.merge_plan.blend_of`)."""


def load_shard(ref: RunRef, epoch: int, shard: int, config: RunConfig | None = None) -> ShardData:
    """Read subtask (run, epoch, shard)'s training rows and build its model.

    Nothing here depends on the head: a worker's spare Dask thread calls this
    while the worker's previous attempt still trains, so the next attempt's
    critical path starts at the claim (only the base weights must be read
    after it, to be the freshest head). Costs one shard's rows of memory
    more while the two overlap. A split larger than ``data.cache_mb`` is
    not read here: the stream reads its chunks while the attempt trains.
    """
    t = time.perf_counter()
    store = ref.store()
    cfg = config if config is not None else ref.config()
    info = open_dataset(store, cfg.data.name)
    objective = objective_for(cfg.train, cfg.data.fields)
    split = info.splits["train"]
    block = split.rows_per_chunk if cfg.data.plan == "blocks" else None
    sizes = planned_sizes(ref, cfg, epoch)
    rows = shard_indices(
        info.n_train, cfg.data.shards, cfg.run.seed, epoch, shard, block=block, sizes=sizes
    )
    fields = objective.fields or None
    budget = cfg.data.cache_mb << 20
    decoded = split.rows * sum(
        a.row_bytes for f, a in split.arrays.items() if f in (fields or split.arrays)
    )
    arrays: dict[str, np.ndarray] | ShardStream
    if decoded <= budget:
        # Small data: the split is decoded once per process and indexed in memory.
        counter = ByteCounter()
        arrays = read_arrays(
            store, cfg.data.name, "train", rows, fields=fields, cache_bytes=budget, counter=counter
        )
    else:
        # Larger than the cache: read block by block while training, never whole.
        arrays = stream_rows(store, cfg.data.name, "train", rows, fields=fields)
        counter = arrays.counter
    model = build_model(
        cfg.model.factory, cfg.model.kwargs, hints=info.factory_hints(cfg.data.fields.get("x", "x"))
    )
    return ShardData(
        (ref.run, epoch, shard),
        arrays,
        model,
        objective,
        time.perf_counter() - t,
        counter,
        share_of(sizes, shard),
    )
