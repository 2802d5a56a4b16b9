"""Acceptance: 8 shards on 2 workers end within 2 points of one-process training.

Runs ``benchmarks/vc_vs_sequential.py``'s comparison on examples/mnist1d.toml
(40 000 samples, cnn1d width 64, adam 3e-3, 50 per worker; the one process
steps on both workers' 100) and prints both accuracy curves: as shipped (the
delta rule, α 0.3 → 0.7) and with DESIGN.md's plain VC-ASGD at α 0.3.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.vc_vs_sequential import compare
from vcdl.config import load_config

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


VC_ASGD = [
    "merge.rule=vc_asgd",
    "merge.schedule=constant",
    "merge.staleness=plain",
    "merge.staleness_grace=0",
]


@pytest.mark.parametrize("overrides", [[], VC_ASGD], ids=["as-shipped", "vc-asgd"])
def test_merge_tracks_sequential(prefect_api: None, tmp_path: Path, overrides: list[str]) -> None:
    cfg = load_config(REPO / "examples" / "mnist1d.toml", ["run.name=vc-vs-seq", *overrides])
    if overrides:
        assert cfg.merge.rule == "vc_asgd" and cfg.merge.alpha == 0.3
    out = compare(cfg, tmp_path)
    print(json.dumps(out))
    print(f"vcdl {out['vcdl_accuracy'][-1]:.4f} vs sequential {out['sequential_accuracy'][-1]:.4f}")
    assert len(out["vcdl_accuracy"]) == cfg.run.epochs
    assert out["vcdl_accuracy"][-1] >= 0.95
    assert out["gap_points"] <= 2.0
