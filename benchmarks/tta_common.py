"""What the time-to-accuracy benchmark's parts and contenders share.

Its sizes (``Settings``, ``QUICK``), MNIST-1D generated once and cached as an
``.npz``, the run config every contender starts from, the accuracy curve of
timed model states (evaluated afterwards, untimed) and the seeded kill
schedule. The method is described in ``benchmarks/time_to_accuracy.py``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vcdl.chaos import ChaosEvent, chaos_schedule
from vcdl.config import RunConfig
from vcdl.config_files import load_config
from vcdl.models import build_model
from vcdl.objectives import Classification
from vcdl.worker.loop import evaluate

REPO = Path(__file__).resolve().parent.parent
Curve = list[tuple[float, float]]  # (seconds after time zero, test accuracy)


@dataclass(frozen=True)
class Settings:
    """Sizes of one benchmark run (``--quick`` shrinks them)."""

    samples: int = 40_000
    shards: int = 8
    workers: int = 2
    width_a: int = 64
    epochs_a: int = 8
    targets_a: tuple[float, ...] = (0.95, 0.97)
    width_b: int = 256
    epochs_b: int = 10
    target_b: float = 0.98
    kill_interval: float = 15.0
    kill_seed: int = 6
    kill_start_after: float = 0.0
    kill_duration: float = 3600.0  # kills only within this many seconds after the start
    repeats_a: int = 3
    repeats_b: int = 1
    # vcdl's fault.checkpoint_seconds in part (b): a kill loses the training
    # since the attempt's last checkpoint (DDP's: since its last epoch).
    checkpoint_seconds_b: float = 1.0
    # Config overrides (section.key=value) of part (a), for every contender.
    overrides_a: tuple[str, ...] = ()
    # More vcdl contenders, side by side with the shipped one in each part:
    # each a comma-separated list of overrides (e.g. "merge.rule=delta").
    variants: tuple[str, ...] = ()
    # Weight copies per epoch of the fault-free one process and DDP: at least
    # as often as vcdl makes versions, so their time-to is never the coarser.
    snapshots: int = 8
    # Part (a) also runs DDP with vcdl's allocator thresholds (``ddp_tuned``):
    # vcdl's workers get them, a plain torchrun does not (vcdl/worker/allocator.py).
    tuned_ddp: bool = True
    config: str = str(REPO / "examples" / "mnist1d.toml")
    cache_dir: str = str(Path(tempfile.gettempdir()) / "vcdl-tta-cache")
    parts: tuple[str, ...] = ("a", "b")


QUICK = Settings(
    samples=8_000,
    width_a=32,
    epochs_a=3,
    targets_a=(0.6, 0.7),
    width_b=64,
    epochs_b=6,
    target_b=0.8,
    # Seed 7: kills at 2.09 s and 3.67 s only. The quick DDP run trains ~0.5 s
    # per epoch (6 epochs, ~3 s): the first kill lands after its first
    # checkpoints, whatever the speed of the machine within 4x; later kills
    # could outlast it (a CI run once had none land with kills from 6.3 s).
    kill_interval=1.5,
    kill_seed=7,
    kill_start_after=1.5,
    kill_duration=2.5,
    repeats_a=1,
    repeats_b=1,
)


# --------------------------------------------------------------------------
# Data, configs, evaluation
# --------------------------------------------------------------------------


def cached_data(cache_dir: str | Path, samples: int) -> Path:
    """MNIST-1D as vcdl generates it, written once to ``cache_dir`` as an ``.npz``."""
    path = Path(cache_dir) / f"mnist1d-{samples}.npz"
    if path.exists():
        return path
    from vcdl.data import make_mnist1d, read_rows
    from vcdl.store import WeightStore

    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vcdl-tta-gen-") as tmp:
        store = WeightStore(tmp)
        make_mnist1d(store, samples=samples)
        x, y = read_rows(store, "mnist1d", "train")
        xt, yt = read_rows(store, "mnist1d", "test")
    tmp_path = path.with_suffix(".tmp.npz")
    np.savez(tmp_path, x_train=x, y_train=y, x_test=xt, y_test=yt)
    os.replace(tmp_path, path)
    return path


def run_config(
    s: Settings, width: int, epochs: int, name: str, overrides: Sequence[str] = ()
) -> RunConfig:
    """examples/mnist1d.toml with this benchmark's sizes, then ``overrides``."""
    return load_config(
        s.config,
        [
            f"run.name={name}",
            f"run.epochs={epochs}",
            f"data.samples={s.samples}",
            f"data.shards={s.shards}",
            f"cluster.workers={s.workers}",
            "model.factory=cnn1d",
            f"model.kwargs.width={width}",
            *overrides,
        ],
    )


def seeded_model(cfg: RunConfig) -> torch.nn.Module:
    torch.manual_seed(cfg.run.seed)  # as vcdl.driver.runs.new_model
    return build_model(cfg.model.factory, cfg.model.kwargs, input_shape=(40,), num_classes=10)


def _test_split(npz: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(npz, allow_pickle=False) as d:
        return d["x_test"], d["y_test"]


def accuracies(
    cfg: RunConfig, npz: Path, states: Sequence[tuple[float, Callable[[], Mapping[str, Any]]]]
) -> Curve:
    """Test accuracy of each timed state (loaded lazily, one at a time), untimed."""
    xt, yt = _test_split(npz)
    model = seeded_model(cfg)
    out = []
    for t, load in states:
        acc = evaluate(
            model, dict(load()), {"x": xt, "y": yt}, Classification(), cfg.data.eval_batch_size
        )["accuracy"]
        out.append((round(t, 2), acc))
    return out


def time_to(curve: Curve, target: float) -> float | None:
    """Seconds to the first durable state at or above ``target``; None if never."""
    return next((t for t, acc in curve if acc >= target), None)


def kill_schedule(s: Settings) -> list[ChaosEvent]:
    """The seeded kill times (seconds after time zero) every contender of part (b) gets."""
    return chaos_schedule(
        1.0 / s.kill_interval,
        s.kill_duration,
        s.kill_seed,
        notice_fraction=0.0,
        start_after=s.kill_start_after,
    )


def snapshot(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(k, v.detach()) for k, v in model.state_dict().items()]
