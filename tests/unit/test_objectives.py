"""vcdl.objectives: each objective's batches, loss and metrics against a hand computation."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vcdl.config import TrainSection, parse_config
from vcdl.errors import ConfigError, DataError
from vcdl.objectives import CausalLM, Classification, Regression, objective_for, to_batch
from vcdl.worker.loop import evaluate, snapshot, train_attempt


def test_integer_data_stays_integer_until_the_batch_is_formed() -> None:
    stored = {"tokens": np.arange(12, dtype=np.uint8).reshape(3, 4), "x": np.ones((3, 2), np.uint8)}
    batch = to_batch(stored)
    assert batch["tokens"].dtype == torch.uint8 and batch["x"].dtype == torch.uint8
    assert CausalLM().prepare(batch)["tokens"].dtype == torch.int64
    prepared = Classification().prepare(
        {"x": batch["x"], "y": torch.tensor([1, 0, 2], dtype=torch.uint8)}
    )
    assert prepared["x"].dtype == torch.float32 and prepared["y"].dtype == torch.int64


def test_classification_matches_cross_entropy_and_accuracy() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    x, y = torch.randn(10, 4), torch.randint(0, 3, (10,))
    obj = Classification()
    batch = obj.prepare({"x": x, "y": y})
    torch.testing.assert_close(obj.loss(model, batch), F.cross_entropy(model(x), y))
    metrics = evaluate(model, snapshot(model), {"x": x.numpy(), "y": y.numpy()}, obj, batch_size=3)
    assert metrics["accuracy"] == pytest.approx(float((model(x).argmax(1) == y).float().mean()))
    assert metrics["loss"] == pytest.approx(float(F.cross_entropy(model(x), y).detach()), rel=1e-5)


def test_regression_is_mean_squared_error_with_rmse() -> None:
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.fill_(1.0)
        model.bias.zero_()
    x = np.array([[1, 2], [3, 4]], dtype=np.float32)
    y = np.array([4.0, 6.0], dtype=np.float64)  # one target per row, against (n, 1) outputs
    metrics = evaluate(model, snapshot(model), {"x": x, "y": y}, Regression(), batch_size=1)
    # predictions 3 and 7: errors 1 and 1.
    assert metrics == {"loss": pytest.approx(1.0), "rmse": pytest.approx(1.0)}


class Bigram(nn.Module):
    """Logits from the previous token only: (b, t) -> (b, t, v)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.table = nn.Embedding(vocab, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.table(idx)


def test_causal_lm_predicts_every_next_token() -> None:
    torch.manual_seed(0)
    model = Bigram(5)
    tokens = np.array([[1, 2, 3, 4], [0, 1, 2, 3]], dtype=np.uint8)
    obj = CausalLM()
    t = torch.from_numpy(tokens).long()
    logits = model(t[:, :-1])
    want = F.cross_entropy(logits.reshape(-1, 5), t[:, 1:].reshape(-1)).detach()
    metrics = evaluate(model, snapshot(model), {"tokens": tokens}, obj, batch_size=1)
    assert metrics["loss"] == pytest.approx(float(want), rel=1e-5)
    assert metrics["perplexity"] == pytest.approx(math.exp(float(want)), rel=1e-5)
    hits = (logits.argmax(-1) == t[:, 1:]).float().mean()
    assert metrics["token_accuracy"] == pytest.approx(float(hits))
    assert "accuracy" not in metrics  # no accuracy where the objective has none


@pytest.mark.parametrize("name", ["regression", "causal_lm"])
def test_training_lowers_the_objective_s_loss(name: str) -> None:
    torch.manual_seed(1)
    rng = np.random.default_rng(1)
    if name == "regression":
        x = rng.normal(size=(256, 3)).astype(np.float32)
        arrays = {"x": x, "y": x @ np.array([1.0, -2.0, 0.5], dtype=np.float32)}
        model: nn.Module = nn.Linear(3, 1)
    else:
        arrays = {"tokens": np.tile(np.arange(8, dtype=np.uint8), (64, 2))[:, :9]}
        model = Bigram(8)
    settings = {"objective": name, "lr": 0.05, "batch_size": 16, "local_epochs": 20}
    cfg = parse_config({"train": settings}).train
    obj = objective_for(cfg)
    before = evaluate(model, snapshot(model), arrays, obj)["loss"]
    out = train_attempt(model, snapshot(model), arrays, cfg, seed=0)
    after = evaluate(model, out.state, arrays, obj)["loss"]
    assert after < 0.5 * before


def test_a_data_set_without_the_objective_s_fields_is_refused() -> None:
    with pytest.raises(DataError, match="objective 'causal_lm' needs the field\\(s\\) tokens"):
        CausalLM().check(["x", "y"])


def test_an_objective_by_import_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "myloss.py").write_text(
        "import torch\n"
        "def loss(model, batch):\n"
        "    return ((model(batch['a'].float()) - batch['b'].float()) ** 2).mean()\n"
        "def metrics(model, batch):\n"
        "    return {'mae': float((model(batch['a'].float()) - batch['b'].float()).abs().mean())}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("VCDL_ALLOW_IMPORTS", "myloss")
    sys.modules.pop("myloss", None)
    cfg = TrainSection(objective="myloss:loss", metrics="myloss:metrics")
    obj = objective_for(cfg)
    model = nn.Linear(1, 1)
    with torch.no_grad():
        model.weight.fill_(2.0)
        model.bias.zero_()
    arrays = {"a": np.array([[1], [2]], dtype=np.int16), "b": np.array([[2], [5]], dtype=np.int16)}
    metrics = evaluate(model, snapshot(model), arrays, obj, batch_size=1)
    assert metrics == {"loss": pytest.approx(0.5), "mae": pytest.approx(0.5)}


@pytest.mark.parametrize(
    ("train", "match"),
    [
        ({"objective": "segmentation"}, "train.objective: must be one of classification"),
        ({"objective": "classification", "metrics": "m:f"}, "train.metrics is for an objective"),
        ({"objective": "nowhere_module:loss"}, "cannot import module 'nowhere_module'"),
        ({"objective": "m:f", "metrics": "not a path"}, "train.metrics: must be an import path"),
    ],
)
def test_bad_objectives_are_one_line_config_errors(
    train: dict[str, object], match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VCDL_ALLOW_IMPORTS", "*")  # import failures, not the allow-list
    with pytest.raises(ConfigError, match=match):
        objective_for(parse_config({"train": train}).train)
