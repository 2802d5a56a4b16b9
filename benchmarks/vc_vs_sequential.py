"""VC-ASGD on a real flow (LocalCluster, 2 workers, 8 shards) vs one plain process.

Trains the same model, same data, same seed and the same number of epochs
(passes over the training set) twice: once with ``vcdl`` (Prefect flow,
Dask LocalCluster, Zarr store, SQLite ledger) and once sequentially in one
plain PyTorch process with one Adam optimizer. Prints the test accuracy after
every epoch for both, the gap at the end, and a one-line JSON summary.

    python benchmarks/vc_vs_sequential.py            # examples/mnist1d.toml as is
    python benchmarks/vc_vs_sequential.py --quick    # 8 000 samples, 3 epochs
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from vcdl.config import RunConfig, load_config
from vcdl.data import open_dataset, read_rows
from vcdl.runs import ensure_dataset, new_model
from vcdl.runtime import open_store
from vcdl.train import evaluate, make_optimizer, snapshot

REPO = Path(__file__).resolve().parent.parent


def sequential(cfg: RunConfig) -> tuple[list[float], float]:
    """Per-epoch test accuracy of plain one-process training, and its training seconds."""
    assert cfg.store.url is not None
    store = open_store(cfg.store.url)
    info = open_dataset(store, cfg.data.name)
    x, y = read_rows(store, cfg.data.name, "train")
    xt, yt = read_rows(store, cfg.data.name, "test")
    torch.set_num_threads(1)
    model = new_model(cfg, info)
    opt = make_optimizer(list(model.parameters()), cfg.train)
    gen = torch.Generator().manual_seed(cfg.run.seed)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    accs, seconds = [], 0.0
    for _ in range(cfg.run.epochs):
        start = time.perf_counter()
        model.train()
        order = torch.randperm(len(xs), generator=gen)
        for i in range(0, len(xs), cfg.train.batch_size):
            idx = order[i : i + cfg.train.batch_size]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(xs[idx]), ys[idx]).backward()
            opt.step()
        seconds += time.perf_counter() - start
        accs.append(evaluate(model, snapshot(model), xt, yt, cfg.data.eval_batch_size)[0])
    return accs, seconds


def compare(cfg: RunConfig, home: Path) -> dict[str, Any]:
    """Run both contenders on ``cfg`` under ``home``; return the figures."""
    from vcdl import api

    cfg = cfg.with_locations(home)
    assert cfg.store.url is not None
    ensure_dataset(open_store(cfg.store.url), cfg)  # generated once, read by both
    start = time.perf_counter()
    summary = api.train(cfg, home=home)
    vc_wall = time.perf_counter() - start
    vc = [h["test_accuracy"] for h in summary["history"]]
    seq, seq_seconds = sequential(cfg)
    return {
        "benchmark": "vc_vs_sequential",
        "data": cfg.data.name,
        "samples": cfg.data.samples,
        "model": cfg.model.factory,
        "epochs": cfg.run.epochs,
        "shards": cfg.data.shards,
        "workers": cfg.cluster.workers,
        "alpha": cfg.merge.alpha,
        "vcdl_accuracy": vc,
        "sequential_accuracy": seq,
        "gap_points": round(100 * (seq[-1] - vc[-1]), 2),
        "vcdl_wall_seconds": round(vc_wall, 1),
        "sequential_train_seconds": round(seq_seconds, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(REPO / "examples" / "mnist1d.toml"))
    p.add_argument("--quick", action="store_true", help="8 000 samples, 3 epochs")
    p.add_argument("--epochs", type=int)
    p.add_argument("--home", help="state directory (default: a temporary one)")
    args = p.parse_args()
    overrides = ["run.name=bench-vc-vs-seq"]
    if args.quick:
        overrides += ["data.samples=8000", "run.epochs=3"]
    if args.epochs:
        overrides.append(f"run.epochs={args.epochs}")
    cfg = load_config(args.config, overrides)
    with tempfile.TemporaryDirectory(prefix="vcdl-bench-") as tmp:
        out = compare(cfg, Path(args.home or tmp))
    print(f"{'epoch':>5} {'vcdl':>8} {'sequential':>10}")
    for i, (a, b) in enumerate(zip(out["vcdl_accuracy"], out["sequential_accuracy"], strict=True)):
        print(f"{i + 1:>5} {a:8.4f} {b:10.4f}")
    print(
        f"after {out['epochs']} epochs: vcdl {out['vcdl_accuracy'][-1]:.4f}, sequential "
        f"{out['sequential_accuracy'][-1]:.4f}, gap {out['gap_points']:+.2f} points"
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
