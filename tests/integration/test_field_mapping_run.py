"""A table with its own column names trains a built-in objective through [data] fields.

The worker's shard read, its training loop, the merge and the driver's
evaluation all read the data set's 'features' and 'target' as the regression
objective's x and y.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from vcdl.config import parse_config
from vcdl.data import import_npz
from vcdl.driver.assimilator import merge_attempt
from vcdl.driver.runs import evaluate_version, prepare_run
from vcdl.runtime import open_store
from vcdl.worker.attempt import run_attempt


def test_a_regression_on_a_table_of_its_own_names(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    features = rng.normal(size=(600, 5)).astype(np.float32)
    target = (features @ rng.normal(size=5)).astype(np.float32)
    np.savez(tmp_path / "table.npz", features=features, target=target)
    cfg = parse_config(
        {
            "run": {"name": "table", "epochs": 1},
            "data": {"name": "table", "shards": 2, "fields": {"x": "features", "y": "target"}},
            "model": {"factory": "mlp", "kwargs": {"num_classes": 1, "hidden": [16]}},
            "train": {"objective": "regression", "batch_size": 20},
        }
    ).with_locations(tmp_path)
    assert cfg.store.url is not None
    import_npz(open_store(cfg.store.url), tmp_path / "table.npz", "table")
    ref, _, _ = prepare_run(cfg)
    ref.ledger().ensure_subtasks(ref.run, 0, 2)
    out = run_attempt(ref, 0, 0, config=cfg)
    assert out.state == "finished" and out.samples, out
    assert merge_attempt(ref, str(out.attempt_id), cfg).kind == "merged"
    ev = evaluate_version(ref, cfg, epoch=0)
    assert ev.loss is not None and math.isfinite(ev.loss) and ev.samples == 120
