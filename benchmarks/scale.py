"""vcdl at real sizes: what a run costs in storage, data reads and worker memory (issue 32).

Each part is one function ``part(args) -> dict`` registered in :data:`PARTS`;
``main`` runs those asked for (``--parts``, default all), prints their
figures, and ends with one JSON line holding every part's summary.

**storage** (part a): the weight store's bytes of one run of a model of
``--params`` float32 parameters (default 100M: 400 MB), ``--epochs`` epochs
of ``--shards`` shards on ``--workers`` workers, once under the default
retention policy (``store.keep``) and once keeping every version (``all``,
vcdl before retention). The training is ``vcdl.models.synthetic``'s sleeper
(a sleep, then a fixed SGD step of every weight): the point is bytes, and
everything that writes them is the real thing (the train flow on a
LocalCluster, the base read, the result written, the streamed merge, the
pruning after merges and at each barrier). Measured: the run's bytes in the
store after the run, and the peak during it (the run's directory summed
every ``--sample-seconds`` in a thread: a peak shorter than that can be
missed). Targets: after a run <= (epochs + 3) x model bytes; during it
<= (epochs + 3 + 2 x workers) x model bytes; reported met or missed.

**data** (parts b and c, benchmarks/scale_data.py): bytes read per epoch
divided by the split's bytes for a ``--gib`` data set (default 2 GiB) with
``data.cache_mb`` = 1, at 8 and 32 shards (target <= 1.25), and a fresh
worker's peak memory training on it against a ``--small-mb`` set (target
<= 0.5 GB above).

No ``--repeats``: the storage part's figures are bytes (the same in every
run), and the data part's are bytes read and a peak, not timings.

    python -m benchmarks.scale                    # both parts at full size
    python -m benchmarks.scale --parts storage    # 100M parameters, 3 epochs, 4 shards, 2 workers
    python -m benchmarks.scale --quick            # CI: 2M parameters, MBs of data
    python -m benchmarks.scale --params 1e8 --epochs 5 --json
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import scale_data
from benchmarks.harness import add_common_options, emit_summary, human_output
from benchmarks.sleeper import sleeper_config, write_sleeper_data
from vcdl.config import RunConfig, parse_config


def storage_config(args: argparse.Namespace, keep: dict[str, Any], home: Path) -> RunConfig:
    name = f"scale-{'all' if keep.get('all') else 'default'}"
    data = sleeper_config(name, args.epochs, args.shards, args.params, args.attempt_seconds)
    data["cluster"] = {"workers": args.workers, "memory_limit": "8GiB"}
    data["store"] = {"keep": keep}
    cfg = parse_config(data)
    return cfg.with_locations(home)


class PeakSampler(threading.Thread):
    """The largest total size of a directory seen, sampled every ``seconds``."""

    def __init__(self, measure: Callable[[], int], seconds: float) -> None:
        super().__init__(daemon=True)
        self.measure, self.seconds = measure, seconds
        self.peak = 0
        self.samples = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.peak = max(self.peak, self.measure())
            self.samples += 1
            self._halt.wait(self.seconds)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.peak = max(self.peak, self.measure())


def _storage_run(args: argparse.Namespace, keep: dict[str, Any], home: Path) -> dict[str, Any]:
    from vcdl import api
    from vcdl.runtime import open_ledger, open_store

    cfg = storage_config(args, keep, home)
    assert cfg.store.url is not None and cfg.ledger.url is not None and cfg.run.name
    write_sleeper_data(cfg, "benchmarks/scale.py: one row per shard")
    store = open_store(cfg.store.url)
    run_dir = f"runs/{cfg.run.name}"
    sampler = PeakSampler(lambda: store.nbytes(run_dir), args.sample_seconds)
    sampler.start()
    started = time.time()
    try:
        summary = api.train(cfg, home=home)
    finally:
        sampler.stop()
    wall = time.time() - started
    if summary["state"] != "completed":
        raise RuntimeError(f"run {cfg.run.name} ended {summary['state']}")
    versions = open_ledger(cfg.ledger.url).versions(cfg.run.name)
    kept = [v.number for v in versions if v.pruned_at is None]
    return {
        "policy": "all" if keep.get("all") else "default",
        "versions": len(versions),
        "kept_versions": kept,
        "after_bytes": store.nbytes(run_dir),
        "peak_bytes": sampler.peak,
        "samples": sampler.samples,
        "wall_s": round(wall, 1),
    }


def storage(args: argparse.Namespace) -> dict[str, Any]:
    """Part (a): the store's bytes after and during a run, default policy and ``all``."""
    model_bytes = int(args.params) * 4
    runs = []
    with tempfile.TemporaryDirectory(prefix="vcdl-scale-") as tmp:
        # One home for both: the first run's holds the ephemeral Prefect
        # server's database, which the process keeps using afterwards.
        home = Path(tmp)
        for policy in args.policies:
            runs.append(_storage_run(args, {"all": True} if policy == "all" else {}, home))
    default = next((r for r in runs if r["policy"] == "default"), None)
    if default is None:
        raise SystemExit("scale.py: the storage targets are about the default policy")
    after_limit = (args.epochs + 3) * model_bytes
    during_limit = (args.epochs + 3 + 2 * args.workers) * model_bytes
    return {
        "params": int(args.params),
        "model_bytes": model_bytes,
        "epochs": args.epochs,
        "shards": args.shards,
        "workers": args.workers,
        "runs": runs,
        "after_limit_bytes": after_limit,
        "during_limit_bytes": during_limit,
        "after_met": default["after_bytes"] <= after_limit,
        "during_met": default["peak_bytes"] <= during_limit,
    }


def print_storage(r: dict[str, Any]) -> None:
    mb = r["model_bytes"]
    print(
        f"storage: {r['params'] / 1e6:.0f}M parameters ({mb / 1e9:.2f} GB), {r['epochs']} epochs "
        f"x {r['shards']} shards, {r['workers']} workers"
    )
    print(
        f"  {'policy':8} {'versions':>8} {'kept':>5} {'after GB':>9} {'x model':>8} "
        f"{'peak GB':>8} {'x model':>8} {'wall s':>7}"
    )
    for run in r["runs"]:
        print(
            f"  {run['policy']:8} {run['versions']:>8} {len(run['kept_versions']):>5} "
            f"{run['after_bytes'] / 1e9:>9.2f} {run['after_bytes'] / mb:>8.2f} "
            f"{run['peak_bytes'] / 1e9:>8.2f} {run['peak_bytes'] / mb:>8.2f} {run['wall_s']:>7}"
        )
    default = next(run for run in r["runs"] if run["policy"] == "default")
    for label, got, limit, met in (
        ("after the run", default["after_bytes"], r["after_limit_bytes"], r["after_met"]),
        ("during the run", default["peak_bytes"], r["during_limit_bytes"], r["during_met"]),
    ):
        print(
            f"  target {label}: {got / mb:.2f} x model <= {limit / mb:.0f} x model: "
            f"{'met' if met else 'MISSED'}"
        )


def data(args: argparse.Namespace) -> dict[str, Any]:
    """Parts (b) and (c): bytes read per epoch and peak worker memory (scale_data.py)."""
    scratch = Path(tempfile.mkdtemp(prefix="vcdl-scale-data-"))
    try:
        r = scale_data.measure(
            scratch,
            nbytes=24 << 20 if args.quick else int(args.gib * 2**30),
            small_bytes=2 << 20 if args.quick else int(args.small_mb * 2**20),
            features=250 if args.quick else 1000,
            shard_counts=(2, 4) if args.quick else (8, 32),
            cache_mb=1,
            rows_plan=True,
            quick=args.quick,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the GBs go, whatever happened
    return {"report": scale_data.report(r), **scale_data.summary(r)}


def print_data(r: dict[str, Any]) -> None:
    print(r["report"])


PARTS: dict[str, tuple[Callable[[argparse.Namespace], dict[str, Any]], Callable[..., None]]] = {
    "storage": (storage, print_storage),
    "data": (data, print_data),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", nargs="+", choices=sorted(PARTS), default=sorted(PARTS))
    p.add_argument("--params", type=float, default=1e8)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--attempt-seconds", type=float, default=1.0)
    p.add_argument("--sample-seconds", type=float, default=0.1)
    p.add_argument(
        "--policies",
        nargs="+",
        choices=["default", "all"],
        default=["default", "all"],
        help="storage: the retention policies to run, in this order",
    )
    p.add_argument("--gib", type=float, default=2.0, help="data: the large set's size (GiB)")
    p.add_argument("--small-mb", type=float, default=20.0, help="data: the small set (MiB)")
    add_common_options(p, quick_help="CI: 2M parameters, 2 epochs, 2 shards", repeats=False)
    args = p.parse_args()
    if args.quick:
        args.params, args.epochs, args.shards, args.attempt_seconds = 2e6, 2, 2, 0.2
    # The sleeper is no built-in: its import path is allowed here, besides
    # whatever the environment already allows (docs/configuration.md).
    allowed = [m for m in os.environ.get("VCDL_ALLOW_IMPORTS", "").split(",") if m.strip()]
    os.environ["VCDL_ALLOW_IMPORTS"] = ",".join([*allowed, "vcdl.models.synthetic"])
    summary: dict[str, Any] = {}
    for name in args.parts:
        part, show = PARTS[name]
        with human_output(args):
            result = part(args)
            show(result)
        summary[name] = {k: v for k, v in result.items() if k != "report"}
    emit_summary("scale", summary, args)


if __name__ == "__main__":
    main()
