"""Integer data stays integer from the store to the batch: token ids are never floats.

A text data set (uint8 byte tokens) goes through the worker's own path: the
store, the shard read, the training loop; the objective sees uint8 tensors
and casts them to int64 itself when the batch is formed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vcdl.config import parse_config
from vcdl.data import import_text, read_arrays
from vcdl.driver.runs import prepare_run
from vcdl.objectives import Batch, CausalLM
from vcdl.runtime import open_store
from vcdl.worker.attempt import run_attempt
from vcdl.worker.shard_data import load_shard


def test_tokens_stay_uint8_until_the_objective_forms_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = tmp_path / "corpus.txt"
    text.write_text("the cat sat on the mat; the dog sat on the log. " * 60)
    cfg = parse_config(
        {
            "run": {"name": "ints", "epochs": 1},
            "data": {"name": "corpus", "shards": 2},
            "model": {"factory": "gpt", "kwargs": {"layers": 1, "heads": 2, "width": 16}},
            "train": {"objective": "causal_lm", "batch_size": 8},
        }
    ).with_locations(tmp_path)
    assert cfg.store.url is not None
    store = open_store(cfg.store.url)
    import_text(store, text, "corpus", context=31)
    assert read_arrays(store, "corpus", "train")["tokens"].dtype == np.uint8

    seen: list[tuple[torch.dtype, torch.dtype]] = []
    prepare = CausalLM.prepare

    def recording(self: CausalLM, batch: Batch) -> Batch:
        out = prepare(self, batch)
        seen.append((batch["tokens"].dtype, out["tokens"].dtype))
        return out

    monkeypatch.setattr(CausalLM, "prepare", recording)
    ref, _, _ = prepare_run(cfg)
    ref.ledger().ensure_subtasks(ref.run, 0, 2)
    shard = load_shard(ref, 0, 0, cfg)
    assert shard.arrays["tokens"].dtype == np.uint8  # the worker holds what the store holds
    out = run_attempt(ref, 0, 0, config=cfg, data=shard)
    assert out.state == "finished" and out.samples == len(shard.arrays["tokens"])
    assert seen and set(seen) == {(torch.uint8, torch.int64)}
