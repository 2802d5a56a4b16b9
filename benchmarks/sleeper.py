"""A run whose training is a sleep (``vcdl.models.synthetic``): its config and its data.

``benchmarks/fleet.py`` and ``benchmarks/scale.py`` measure what is around
training -- dispatch, the ledger, the store's bytes, the merge -- with a
model of many parameters that trains for a fixed number of seconds. Both
build the same run here; so does a test (tests/integration/test_memory_admission.py),
which is why the helper lives beside the benchmarks, not in ``tests/``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vcdl.config import RunConfig


def sleeper_config(
    name: str, epochs: int, shards: int, params: float, seconds: float
) -> dict[str, Any]:
    """Raw config data (before validation) of a sleeper run: VC-ASGD, α 0.5, one row a shard."""
    return {
        "run": {"name": name, "epochs": epochs, "seed": 0},
        "data": {"name": f"sleeper-{shards}", "shards": shards, "eval_batch_size": 1},
        "model": {
            "factory": "vcdl.models.synthetic:sleeper",
            "kwargs": {"params": int(params), "seconds": seconds},
        },
        "train": {
            "objective": "vcdl.models.synthetic:sleep_loss",
            "optimizer": "sgd",
            "lr": 1.0,
            "batch_size": 1,
        },
        "merge": {"rule": "vc_asgd", "alpha": 0.5},
    }


def write_sleeper_data(cfg: RunConfig, source: str) -> None:
    """One row per shard in the run's store: every attempt is one batch, one sleep."""
    from vcdl.data import write_arrays
    from vcdl.runtime import open_store

    assert cfg.store.url is not None
    write_arrays(
        open_store(cfg.store.url),
        cfg.data.name,
        {
            "train": {"x": np.zeros((cfg.data.shards, 1), np.float32)},
            "test": {"x": np.zeros((1, 1), np.float32)},
        },
        source=source,
    )
