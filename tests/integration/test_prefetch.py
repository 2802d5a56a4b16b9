"""A shard's rows read ahead of the claim train exactly what the attempt would have read.

The spare Dask thread calls ``load_shard`` while the worker's previous attempt
trains; ``run_attempt`` must use it only for its own subtask, and the result
must not depend on who read the rows.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.integration.test_failure_modes import make_run
from vcdl.runtime import RunRef
from vcdl.types import StateDict
from vcdl.worker.attempt import run_attempt
from vcdl.worker.shard_data import load_shard


def _result(ref: RunRef, attempt_id: str | None) -> StateDict:
    assert attempt_id is not None
    uri = ref.ledger().get_attempt(attempt_id).result_uri
    assert uri is not None
    return ref.store().read_state(uri)


def test_read_ahead_trains_the_same_result(tmp_path: Path) -> None:
    own, cfg = make_run(tmp_path / "own")
    ahead, cfg_ahead = make_run(tmp_path / "ahead")

    read_itself = run_attempt(own, 0, 1, config=cfg)
    data = load_shard(ahead, 0, 1, cfg_ahead)
    assert data.key == (ahead.run, 0, 1) and len(data.arrays["x"]) == len(data.arrays["y"]) > 0
    read_ahead = run_attempt(ahead, 0, 1, config=cfg_ahead, data=data)

    assert "data" in read_itself.timings and "data_ahead" not in read_itself.timings
    assert "data_ahead" in read_ahead.timings and "data" not in read_ahead.timings
    a, b = _result(own, read_itself.attempt_id), _result(ahead, read_ahead.attempt_id)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


def test_rows_of_another_subtask_are_not_used(tmp_path: Path) -> None:
    ref, cfg = make_run(tmp_path)
    wrong = load_shard(ref, 0, 2, cfg)
    out = run_attempt(ref, 0, 1, config=cfg, data=wrong)
    # It read shard 1's rows itself: the samples are shard 1's.
    assert "data" in out.timings and "data_ahead" not in out.timings
    assert out.samples == len(load_shard(ref, 0, 1, cfg).arrays["x"]) * cfg.train.local_epochs
