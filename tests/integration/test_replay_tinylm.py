"""Issue 53's target: ``examples/tinylm.toml`` (a GPT, AdamW, ``optimizer_state = "worker"``)
replays bit for bit.

A small slice of it, so that it fits in CI: 2 epochs of 4 shards on its 2
local workers and a smaller GPT (the example's data set, objective, optimizer
and carried optimizer state unchanged). Every attempt but each worker's first
continues its worker's AdamW state, so the replay must re-train them in the
order of that chain.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from vcdl import api
from vcdl.config_files import load_config
from vcdl.replay.plan import replay_inputs

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tinylm.toml"

SMALL = [
    "run.epochs=2",
    "data.shards=4",
    "model.kwargs.layers=1",
    "model.kwargs.heads=2",
    "model.kwargs.width=32",
]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_tinylm_with_the_workers_optimizer_state_replays_bit_for_bit(
    prefect_api: None, tmp_path: Path
) -> None:
    cfg = load_config(EXAMPLE, SMALL)
    assert cfg.train.optimizer_state == "worker" and cfg.train.optimizer == "adamw"
    began = time.perf_counter()
    summary = api.train(cfg, home=tmp_path)
    trained = time.perf_counter() - began
    assert summary["state"] == "completed" and summary["head_version"] == 8
    ledger = api.run_ref("tinylm", home=tmp_path).ledger()
    merged = [a for a in ledger.attempts("tinylm") if a.state == "merged"]
    carried = [a for a in merged if (replay_inputs(a) or {}).get("optimizer_from")]
    # Each worker's first attempt starts a fresh AdamW; the others continue one.
    assert len(merged) == 8 and len(carried) >= 6, [replay_inputs(a) for a in merged]
    report = api.replay("tinylm", home=tmp_path)
    print(
        f"tinylm slice: trained in {trained:.1f} s, replayed in {report.seconds:.1f} s "
        f"({report.trainings} trainings; {len(carried)} of {len(merged)} merged attempts "
        "carried an optimizer state)"
    )
    assert report.divergence is None, report.divergence
    assert report.bit_for_bit and (report.versions, report.compared) == (8, 8)
