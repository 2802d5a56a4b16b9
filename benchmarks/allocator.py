"""Training throughput in Dask workers, with and without vcdl's allocator settings.

Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which
puts every allocation above 128 KiB on glibc's mmap path (vcdl/worker/allocator.py).
This measures what that costs a PyTorch training loop and what vcdl's
warm-up gets back, side by side in one run: MNIST-1D-shaped batches (100 ×
40), ``cnn1d`` width 256, Adam, one torch thread per trainer, two trainers
at once (as two workers train on this 2-core machine):

* two plain processes, a clean environment;
* two plain processes with Dask's ``MALLOC_TRIM_THRESHOLD_=65536``;
* two plain processes with vcdl's thresholds (as glibc environment variables);
* two workers of a plain ``distributed.LocalCluster`` (Dask's defaults);
* two workers of vcdl's cluster (``flows.cluster.dask_cluster``: forkserver
  workers, the warm-up plugin that calls ``vcdl.worker.allocator.tune_allocator``).

Rounds alternate the contenders; figures are medians over ``--repeats``
rounds of the per-trainer samples/s, and the minor page faults per training
step of the training thread.

    python -m benchmarks.allocator              # 3 rounds × 8 s per contender
    python -m benchmarks.allocator --quick      # 1 round × 2 s (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import add_common_options, emit_summary, human_output, median
from vcdl.worker.allocator import TUNED_ENV

REPO = Path(__file__).resolve().parent.parent
DASK_ENV = {"MALLOC_TRIM_THRESHOLD_": "65536"}
WIDTH = 256


def train_for(seconds: float, width: int = WIDTH) -> dict[str, float]:
    """Train ``cnn1d`` on random MNIST-1D-shaped batches for ``seconds`` in this thread."""
    import resource

    import torch
    import torch.nn.functional as F

    from vcdl.models import cnn1d

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = cnn1d(width=width)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = torch.randn(100, 40), torch.randint(0, 10, (100,))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(20):  # kernels initialized, the thread's arena settled
        step()
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    start, steps = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
    elapsed = time.perf_counter() - start
    return {
        "samples_per_s": steps * 100 / elapsed,
        "faults_per_step": (resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults) / steps,
    }


def plain_processes(seconds: float, extra_env: dict[str, str]) -> list[dict[str, float]]:
    """Two plain interpreters training at once."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(extra_env, PYTHONPATH=str(REPO))
    code = (
        "import json; from benchmarks.allocator import train_for; "
        f"print(json.dumps(train_for({seconds})))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True, cwd=REPO
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=seconds + 120)[0] for p in procs]
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def dask_workers(seconds: float, vcdl: bool) -> list[dict[str, float]]:
    """Two workers of a LocalCluster (Dask's defaults) or of vcdl's cluster, training at once."""
    from distributed import Client, LocalCluster

    def on(address: str) -> list[dict[str, float]]:
        with Client(address) as client:
            workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
            futures = [
                client.submit(train_for, seconds, workers=[w], pure=False) for w in workers[:2]
            ]
            return list(client.gather(futures))

    if vcdl:
        from flows.cluster import dask_cluster
        from vcdl.config import RunConfig

        cfg = RunConfig.model_validate({"cluster": {"workers": 2}, "train": {"threads": 1}})
        with dask_cluster(cfg) as address:
            return on(address)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True) as cluster:
        return on(cluster.scheduler_address)


CONTENDERS: dict[str, Callable[[float], list[dict[str, float]]]] = {
    "plain processes": lambda s: plain_processes(s, {}),
    "plain processes, MALLOC_TRIM_THRESHOLD_=65536": lambda s: plain_processes(s, DASK_ENV),
    "plain processes, vcdl's thresholds": lambda s: plain_processes(s, TUNED_ENV),
    "Dask LocalCluster workers (Dask's defaults)": lambda s: dask_workers(s, vcdl=False),
    "vcdl's cluster workers (allocator tuned)": lambda s: dask_workers(s, vcdl=True),
}


def run(seconds: float, repeats: int, log: Callable[[str], None]) -> dict[str, Any]:
    rounds: dict[str, list[list[dict[str, float]]]] = {k: [] for k in CONTENDERS}
    for r in range(repeats):
        order = list(CONTENDERS) if r % 2 == 0 else list(reversed(CONTENDERS))
        for name in order:
            out = CONTENDERS[name](seconds)
            rounds[name].append(out)
            rates = ", ".join(f"{o['samples_per_s']:.0f}" for o in out)
            log(f"round {r + 1}/{repeats} {name}: {rates} samples/s per trainer")
    res: dict[str, Any] = {"seconds": seconds, "repeats": repeats, "width": WIDTH, "contenders": {}}
    for name, rs in rounds.items():
        per_round = [statistics.mean(o["samples_per_s"] for o in outs) for outs in rs]
        faults = [statistics.mean(o["faults_per_step"] for o in outs) for outs in rs]
        res["contenders"][name] = {
            "samples_per_s": median(per_round),
            "runs": [round(v) for v in per_round],
            "faults_per_step": median(faults),
        }
    c = res["contenders"]
    res["vcdl_vs_dask"] = (
        c["vcdl's cluster workers (allocator tuned)"]["samples_per_s"]
        / c["Dask LocalCluster workers (Dask's defaults)"]["samples_per_s"]
    )
    res["vcdl_vs_plain"] = (
        c["vcdl's cluster workers (allocator tuned)"]["samples_per_s"]
        / c["plain processes"]["samples_per_s"]
    )
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(
        p,
        quick_help="1 round of 2 s per contender (CI)",
        repeats_default=3,
        repeats_help="rounds; figures are medians",
    )
    p.add_argument("--seconds", type=float, default=8.0, help="training seconds per trainer")
    args = p.parse_args()
    seconds, repeats = (2.0, 1) if args.quick else (args.seconds, args.repeats)
    with human_output(args):
        res = run(seconds, repeats, log=lambda m: print(m, flush=True))
        print_table(res)
    emit_summary(
        "allocator",
        {
            "vcdl_vs_dask": round(res["vcdl_vs_dask"], 3),
            "vcdl_vs_plain": round(res["vcdl_vs_plain"], 3),
            "samples_per_s": {k: round(v["samples_per_s"]) for k, v in res["contenders"].items()},
            "faults_per_step": {
                k: round(v["faults_per_step"], 1) for k, v in res["contenders"].items()
            },
        },
        args,
    )


def print_table(res: dict[str, Any]) -> None:
    repeats = res["repeats"]
    print(f"\ncnn1d width {WIDTH}, batch 100, 2 trainers at once, medians of {repeats} round(s):")
    print(f"{'contender':<48} {'samples/s per trainer':>22} {'page faults per step':>21}")
    for name, c in res["contenders"].items():
        runs = ", ".join(str(v) for v in c["runs"])
        print(f"{name:<48} {c['samples_per_s']:>10.0f} ({runs}) {c['faults_per_step']:>12.1f}")
    print(
        f"vcdl's workers vs Dask's defaults: {res['vcdl_vs_dask']:.2f}x; "
        f"vs plain processes: {res['vcdl_vs_plain']:.2f}x"
    )


if __name__ == "__main__":
    main()
