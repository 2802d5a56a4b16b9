"""train.optimizer_state = "worker": an attempt continues its worker's last optimizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vcdl.config import TrainSection
from vcdl.worker.loop import carry, make_optimizer, snapshot, train_attempt


def _data(n: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 6)).astype(np.float32), rng.integers(0, 3, size=n)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


CFG = TrainSection(optimizer="adam", lr=0.01, batch_size=16)


def _reference(base: dict[str, torch.Tensor], x: np.ndarray, y: np.ndarray, seeds: list[int]):
    """One Adam over the batches of every seed's attempt in turn: what carrying must equal."""
    model = _model()
    model.load_state_dict(base)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()
    for seed in seeds:
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
        for i in range(0, len(x), CFG.batch_size):
            idx = order[i : i + CFG.batch_size]
            opt.zero_grad()
            F.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
    return snapshot(model)


def test_two_carried_attempts_equal_one_optimizer_over_both() -> None:
    x, y = _data()
    base = snapshot(_model())
    first = train_attempt(_model(), base, {"x": x, "y": y}, CFG, seed=1)
    assert first.optimizer_state is not None
    second = train_attempt(
        _model(), first.state, {"x": x, "y": y}, CFG, seed=2, optimizer_state=first.optimizer_state
    )
    want = _reference(base, x, y, [1, 2])
    for k, v in want.items():
        torch.testing.assert_close(second.state[k], v)
    # A fresh optimizer for the second attempt is a different trajectory.
    fresh = train_attempt(_model(), first.state, {"x": x, "y": y}, CFG, seed=2)
    assert not all(torch.equal(fresh.state[k], second.state[k]) for k in want)


def test_a_state_that_does_not_fit_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    x, y = _data()
    other = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    opt = torch.optim.Adam(other.parameters())
    other(torch.zeros(2, 6)).sum().backward()
    opt.step()
    alien = opt.state_dict()  # the same number of tensors, other shapes
    base = snapshot(_model())
    with caplog.at_level("WARNING", logger="vcdl.worker.loop"):
        carried = train_attempt(
            _model(), base, {"x": x, "y": y}, CFG, seed=1, optimizer_state=alien
        )
    assert "does not fit" in caplog.text  # said on the worker, not silently dropped
    caplog.clear()
    fresh = train_attempt(_model(), base, {"x": x, "y": y}, CFG, seed=1)
    assert "does not fit" not in caplog.text
    for k in base:
        assert torch.equal(carried.state[k], fresh.state[k])
    own = make_optimizer(list(_model().parameters()), CFG)
    assert carry(own, alien) is False
    assert carry(own, {"nonsense": 1}) is False
    assert carry(own, {"state": {}, "param_groups": []}) is False


def test_the_hyperparameters_stay_the_runs_own() -> None:
    model = _model()
    old = torch.optim.Adam(model.parameters(), lr=1.0, weight_decay=0.5)
    model(torch.zeros(2, 6)).sum().backward()
    old.step()
    opt = make_optimizer(list(model.parameters()), CFG)
    assert carry(opt, old.state_dict()) is True
    assert opt.param_groups[0]["lr"] == pytest.approx(CFG.lr)
    assert opt.param_groups[0]["weight_decay"] == 0.0
    assert int(opt.state_dict()["state"][0]["step"]) == 1  # the moments did carry
