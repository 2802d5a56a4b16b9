"""Acceptance: VC-ASGD (8 shards, 2 workers) within 2 points of one-process training.

Runs ``benchmarks/vc_vs_sequential.py``'s comparison on examples/mnist1d.toml
as shipped (40 000 samples, cnn1d width 64, adam 3e-3, 50 per worker; the
one process steps on both workers' 100) and prints both accuracy curves.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.vc_vs_sequential import compare
from vcdl.config import load_config

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_vc_asgd_tracks_sequential(prefect_api: None, tmp_path: Path) -> None:
    cfg = load_config(REPO / "examples" / "mnist1d.toml", ["run.name=vc-vs-seq"])
    out = compare(cfg, tmp_path)
    print(json.dumps(out))
    print(f"vcdl {out['vcdl_accuracy'][-1]:.4f} vs sequential {out['sequential_accuracy'][-1]:.4f}")
    assert len(out["vcdl_accuracy"]) == cfg.run.epochs
    assert out["vcdl_accuracy"][-1] >= 0.95
    assert out["gap_points"] <= 2.0
