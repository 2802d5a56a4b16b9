"""A run whose model evaluates to NaN finishes, and its NaN is recorded (issue 54, item 5).

Before: SQLite stored the NaN loss as NULL, the NOT NULL ``evaluation.loss``
column refused the row (``NOT NULL constraint failed: evaluation.loss``),
and the evaluation killed the run. tests/contract/test_nan_evaluation.py pins
the ledger's side; here a whole run, as a user runs it: a model that trains
normally but whose every evaluation is NaN (:func:`nan_in_eval`). The run
completes with exit 0, no traceback, its evaluations are NaN in the ledger,
and ``vcdl audit --deep`` finds nothing wrong.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[2]

CONFIG = """
[run]
name = "nan"
epochs = 1
[data]
name = "digits"
shards = 1
[model]
factory = "tests.integration.test_nan_evaluation_run:nan_in_eval"
"""


class NanInEval(nn.Module):
    """A linear classifier whose outputs are NaN in eval mode only (training is normal)."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x.reshape(len(x), -1))
        return out if self.training else out * math.nan


def nan_in_eval(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return NanInEval(math.prod(input_shape), num_classes)


@pytest.mark.slow
def test_a_run_whose_evaluations_are_nan_completes_and_audits_clean(
    tmp_path: Path, prefect_api_url: str
) -> None:
    cfg = tmp_path / "nan.toml"
    cfg.write_text(CONFIG)
    home = tmp_path / "home"
    env = dict(os.environ, PREFECT_API_URL=prefect_api_url, PREFECT_HOME=str(tmp_path / "p"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "vcdl.cli",
            "train",
            str(cfg),
            "--home",
            str(home),
            "--workers",
            "1",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "run nan: completed" in done.stdout, done.stdout
    from vcdl import api
    from vcdl.ledger import Ledger, evaluation_metrics
    from vcdl.views.audit import audit_run

    with Ledger(f"sqlite:///{home / 'ledger.db'}") as ledger:
        evaluations = ledger.evaluations("nan")
        assert evaluations and all(
            math.isnan(evaluation_metrics(e)["loss"]) for e in evaluations
        ), evaluations
    assert audit_run(api.run_ref("nan", home), deep=True) == []
