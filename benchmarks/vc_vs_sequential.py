"""vcdl's asynchronous merge on a real flow (LocalCluster, 2 workers, 8 shards) vs one process.

Trains the same model, same data, same seed and the same number of epochs
(passes over the training set) twice: once with ``vcdl`` (Prefect flow,
Dask LocalCluster, Zarr store, SQLite ledger) and once sequentially in one
plain PyTorch process with one Adam optimizer. Prints the test accuracy after
every epoch for both, the gap at the end, and a one-line JSON summary.

    python benchmarks/vc_vs_sequential.py            # examples/mnist1d.toml as is
    python benchmarks/vc_vs_sequential.py --quick    # 8 000 samples, 3 epochs
    python benchmarks/vc_vs_sequential.py --set merge.rule=vc_asgd --set merge.staleness=plain
"""

from __future__ import annotations

import argparse
import json
import statistics
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
    """Per-epoch test accuracy of plain one-process training, and its training seconds.

    The process steps on the global batch: vcdl's ``train.batch_size`` is
    per worker, so one step here sees what the workers' steps see together.
    """
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
    batch = cfg.global_batch_size
    accs, seconds = [], 0.0
    for _ in range(cfg.run.epochs):
        start = time.perf_counter()
        model.train()
        order = torch.randperm(len(xs), generator=gen)
        for i in range(0, len(xs), batch):
            idx = order[i : i + batch]
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
        "worker_batch": cfg.train.batch_size,
        "sequential_batch": cfg.global_batch_size,
        "rule": cfg.merge.rule,
        "staleness": cfg.merge.staleness,
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
    p.add_argument("--repeats", type=int, default=1, help="runs; figures are medians")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override for vcdl, e.g. merge.rule=vc_asgd (repeatable)",
    )
    args = p.parse_args()
    overrides = ["run.name=bench-vc-vs-seq", *args.set]
    if args.quick:
        overrides += ["data.samples=8000", "run.epochs=3"]
    if args.epochs:
        overrides.append(f"run.epochs={args.epochs}")
    cfg = load_config(args.config, overrides)
    runs = []
    # One home for every repeat, each a run of its own: Prefect's temporary
    # server starts once per process with its database in the first home, so
    # a home per repeat, deleted after it, took the server's tables with it.
    with tempfile.TemporaryDirectory(prefix="vcdl-bench-") as tmp:
        for i in range(args.repeats):
            out = compare(cfg.updated(run={"name": f"{cfg.run.name}-{i + 1}"}), Path(tmp))
            runs.append(out)
            print(f"run {i + 1}/{args.repeats}: {json.dumps(out)}", flush=True)
    med = {
        key: statistics.median(r[key] for r in runs)
        for key in ("gap_points", "vcdl_wall_seconds", "sequential_train_seconds")
    }
    vc_curve = [statistics.median(c) for c in zip(*(r["vcdl_accuracy"] for r in runs), strict=True)]
    seq_curve = [
        statistics.median(c) for c in zip(*(r["sequential_accuracy"] for r in runs), strict=True)
    ]
    print(f"medians of {len(runs)} run(s):")
    print(f"{'epoch':>5} {'vcdl':>8} {'sequential':>10}")
    for i, (a, b) in enumerate(zip(vc_curve, seq_curve, strict=True)):
        print(f"{i + 1:>5} {a:8.4f} {b:10.4f}")
    print(
        f"after {cfg.run.epochs} epochs: vcdl (merge {cfg.merge.rule}, alpha {cfg.merge.alpha}, "
        f"staleness {cfg.merge.staleness}) {vc_curve[-1]:.4f}, sequential {seq_curve[-1]:.4f}, "
        f"gap {med['gap_points']:+.2f} points; vcdl wall {med['vcdl_wall_seconds']:.0f}s "
        "(incl. Prefect and cluster start), sequential training "
        f"{med['sequential_train_seconds']:.0f}s"
    )
    print(
        json.dumps(
            {
                "benchmark": "vc_vs_sequential",
                "repeats": len(runs),
                "vcdl_accuracy": vc_curve,
                "sequential_accuracy": seq_curve,
                **med,
            }
        )
    )


if __name__ == "__main__":
    main()
