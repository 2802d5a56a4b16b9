"""The CUDA path: placement, bf16 autocast, no host synchronisation per training step.

Runs where CUDA exists; skips with the reason elsewhere (this repository's CI
machines have no GPU). Nothing else in the suite depends on a GPU.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from vcdl.config import TrainSection, parse_config
from vcdl.models import build_model
from vcdl.objectives import objective_for, to_batch
from vcdl.worker.loop import evaluate, resolve_device, snapshot, train_attempt

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device on this machine"
)


def _lm(
    steps: int, amp: bool = False
) -> tuple[torch.nn.Module, dict[str, np.ndarray], TrainSection]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 64, size=(steps * 8, 33), dtype=np.uint8)
    cfg = parse_config(
        {
            "train": {
                "objective": "causal_lm",
                "batch_size": 8,
                "device": "cuda",
                "amp": amp,
                "optimizer": "adamw",
            }
        }
    ).train
    torch.manual_seed(0)
    model = build_model(
        "gpt",
        {"layers": 1, "heads": 2, "width": 32},
        hints={"vocab_size": 64, "context_length": 32},
    )
    return model, {"tokens": tokens}, cfg


def test_auto_picks_cuda_and_batches_arrive_on_it_from_pinned_memory() -> None:
    assert resolve_device("auto").type == "cuda"
    batch = to_batch({"tokens": np.zeros((4, 3), np.uint8)}, torch.device("cuda"))
    assert batch["tokens"].is_cuda and batch["tokens"].dtype == torch.uint8


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16-autocast"])
def test_training_on_cuda_learns_and_returns_cpu_weights(amp: bool) -> None:
    model, arrays, cfg = _lm(20, amp=amp)
    obj = objective_for(cfg)
    start = snapshot(model)
    before = evaluate(model, start, arrays, obj, device_name="cuda")["loss"]
    out = train_attempt(model, start, arrays, cfg, seed=0)
    assert all(t.device.type == "cpu" for t in out.state.values())
    assert np.isfinite(out.mean_loss)
    after = evaluate(model, out.state, arrays, obj, device_name="cuda")["loss"]
    assert after < before


def _syncs(steps: int) -> int:
    model, arrays, cfg = _lm(steps)
    base = snapshot(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            train_attempt(model, base, arrays, cfg, seed=0)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def test_no_host_synchronisation_per_step() -> None:
    # Set-up and the result's copy to the host synchronise; the steps must not.
    # A warm-up attempt first: the first one in a process also pays one-off
    # lazy initialisation (on an H100: 36 synchronising calls for the first
    # 10-step attempt, 35 for a 40-step one after it).
    _syncs(2)
    short, long = _syncs(10), _syncs(40)
    # 30 more steps: a synchronisation per step would add 30.
    assert long <= short + 1, f"{short} synchronising calls for 10 steps, {long} for 40"


def test_evaluation_on_cuda_matches_the_cpu() -> None:
    model, arrays, cfg = _lm(4)
    obj = objective_for(cfg)
    state = snapshot(model)
    on_gpu = evaluate(model, state, arrays, obj, device_name="cuda")
    on_cpu = evaluate(model, state, arrays, obj, device_name="cpu")
    assert on_gpu.keys() == on_cpu.keys()
    for k in on_cpu:
        assert on_gpu[k] == pytest.approx(on_cpu[k], rel=1e-3)
