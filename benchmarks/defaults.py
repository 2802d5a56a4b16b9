"""Defaults on jobs nobody tuned: candidate default settings against one plain process.

Each job is stripped to what a new user writes: the data, the model, the
objective, the optimizer, its learning rate and batch size, the epochs, 2
workers of equal speed. Nothing of the merge, nothing of the optimizer's
state. Each candidate set of defaults is applied on top (``defaults``: none,
vcdl's defaults as they are) and trained with vcdl (a real flow: Prefect, a
LocalCluster, the ledger and the store); one plain PyTorch process trains
the same model from the same initialization at the global batch for as
many epochs. Medians over ``--seeds``; the gap is one process minus vcdl in
points of accuracy (classifiers) or vcdl's loss above one process's in %
of it (language model, regression); the target: within 1 point / 1 %.

Jobs: ``mnist1d`` (examples/mnist1d.toml), ``tinylm`` (examples/tinylm.toml,
6 of its 16 epochs), ``digits`` (examples/digits.toml, a CNN) and
``diabetes`` (scikit-learn's bundled diabetes progression table, 442
patients, 10 measurements: a regression MLP on the standardized target,
the last 20 % of a seeded permutation held out).

    python -m benchmarks.defaults                     # 4 jobs, 3 candidates, 3 seeds
    python -m benchmarks.defaults --jobs digits diabetes --seeds 1
    python -m benchmarks.defaults --quick             # CI: digits, 4 epochs, 2 candidates
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import add_common_options, emit_summary, human_output, median
from benchmarks.rules import one_process, vcdl_run
from vcdl.config import RunConfig, parse_config
from vcdl.config_files import apply_overrides, read_toml
from vcdl.data import write_arrays
from vcdl.driver.runs import ensure_dataset
from vcdl.runtime import open_store

REPO = Path(__file__).resolve().parent.parent

# name -> (example config or None, metric, higher is better, overrides of the job)
JOBS: dict[str, tuple[str | None, str, bool, dict[str, Any]]] = {
    "mnist1d": ("examples/mnist1d.toml", "accuracy", True, {}),
    "tinylm": ("examples/tinylm.toml", "loss", False, {"run": {"epochs": 6}}),
    "digits": ("examples/digits.toml", "accuracy", True, {}),
    "diabetes": (
        None,
        "loss",
        False,
        {
            "run": {"name": "diabetes", "epochs": 20},
            "data": {"name": "diabetes", "shards": 2, "eval_batch_size": 100},
            "model": {"factory": "mlp", "kwargs": {"num_classes": 1, "hidden": [64, 64]}},
            "train": {"objective": "regression", "optimizer": "adam", "lr": 1e-3, "batch_size": 16},
        },
    ),
}
# What a user who tunes nothing writes: these keys of the example, nothing else.
KEPT = {
    "run": ("name", "seed", "epochs"),
    "data": ("name", "samples", "shards", "eval_batch_size"),
    "model": ("factory", "kwargs"),
    "train": ("objective", "optimizer", "lr", "batch_size", "local_epochs"),
}
# "defaults" keeps the worker's optimizer (the default since it won here);
# "fresh optimizer" is the default it replaced, kept to show the gap.
CANDIDATES: dict[str, list[str]] = {
    "defaults": [],
    "fresh optimizer": ["train.optimizer_state=fresh"],
    # cluster.overlap_epochs: off by default until it holds on these jobs too.
    "defaults, overlap": ["cluster.overlap_epochs=true"],
    "defaults, cosine": [
        "merge.alpha=0.2",
        "merge.schedule=cosine",
        "merge.alpha_end=0.6",
        "merge.staleness=raise",
        "merge.staleness_grace=1",
    ],
}


def untuned(job: str) -> dict[str, Any]:
    """The job as a new user writes it: only :data:`KEPT`'s keys, 2 workers."""
    path, _, _, over = JOBS[job]
    full = read_toml(REPO / path) if path else {}
    data: dict[str, Any] = {
        section: {k: full[section][k] for k in keys if k in full.get(section, {})}
        for section, keys in KEPT.items()
    }
    for section, values in over.items():
        data.setdefault(section, {}).update(values)
    data["cluster"] = {"workers": 2}
    return data


def gap(value: float, ref: float, higher: bool) -> float:
    """Points of accuracy below one process, or loss above it as a fraction of it."""
    return ref - value if higher else (value - ref) / ref


def make_diabetes(store_url: str) -> None:
    """scikit-learn's diabetes table, standardized with the training rows' statistics."""
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    cut = int(0.8 * len(y))
    tr, te = order[:cut], order[cut:]
    mx, sx = x[tr].mean(0), x[tr].std(0)
    my, sy = y[tr].mean(), y[tr].std()

    def split(idx: np.ndarray) -> dict[str, np.ndarray]:
        return {
            "x": ((x[idx] - mx) / sx).astype(np.float32),
            "y": ((y[idx] - my) / sy).astype(np.float32),
        }

    write_arrays(
        open_store(store_url),
        "diabetes",
        {"train": split(tr), "test": split(te)},
        source="sklearn.datasets.load_diabetes (442 rows), standardized",
    )


def bench(
    job: str, candidates: Sequence[str], seeds: Sequence[int], extra: Sequence[str], home: Path
) -> dict[str, Any]:
    _, metric, higher, _ = JOBS[job]
    raw = untuned(job)

    def config(over: Sequence[str]) -> RunConfig:
        return parse_config(apply_overrides(raw, [*extra, *over]))

    base = config([]).with_locations(home)
    assert base.store.url is not None
    if job == "diabetes":
        make_diabetes(base.store.url)
    ensure_dataset(open_store(base.store.url), base)
    plain = [one_process(base.updated(run={"seed": s}), metric) for s in seeds]
    rows: dict[str, list[float]] = {"one process": [m for m, _ in plain]}
    seconds: dict[str, list[float]] = {"one process": [t for _, t in plain]}
    print(f"[{job}] one process: {rows['one process']}", flush=True)
    for name in candidates:
        runs = []
        for seed in seeds:
            cfg = config([*CANDIDATES[name], f"run.seed={seed}"])
            run = f"defaults-{job}-{name.replace(' ', '-').replace(',', '')}-s{seed}"
            runs.append(vcdl_run(cfg.updated(run={"name": run}), metric, home))
        rows[name], seconds[name] = [m for m, _ in runs], [t for _, t in runs]
        print(f"[{job}] {name}: {rows[name]} ({seconds[name]} s)", flush=True)
    return summarize(job, metric, higher, rows, seconds)


def summarize(
    job: str,
    metric: str,
    higher: bool,
    rows: Mapping[str, Sequence[float]],
    seconds: Mapping[str, Sequence[float]],
) -> dict[str, Any]:
    """Medians, ranges and gaps to one process; which candidates meet the target; the
    median wall seconds of each (a vcdl run's include Prefect's and its cluster's start)."""
    ref = median(rows["one process"])
    table: dict[str, dict[str, float]] = {
        name: {
            "median": round(median(vals), 4),
            "min": round(min(vals), 4),
            "max": round(max(vals), 4),
            "gap": round(gap(median(vals), ref, higher), 4),
            "seconds": round(median(seconds[name]), 1),
        }
        for name, vals in rows.items()
    }
    target = 0.01
    met = {n: r["gap"] <= target for n, r in table.items() if n != "one process"}
    return {"job": job, "metric": metric, "target_gap": target, "rows": table, "met": met}


def print_job(r: Mapping[str, Any]) -> None:
    unit = "points" if r["metric"] == "accuracy" else "% of one process"
    print(f"\n{r['job']}: test {r['metric']}, 2 workers, gap in {unit} (target <= 1)")
    print(f"{'':26} {'median':>8} {'min':>8} {'max':>8} {'gap':>7} {'wall s':>7}")
    for name, row in r["rows"].items():
        verdict = "" if name == "one process" else ("met" if r["met"][name] else "MISSED")
        print(
            f"{name:26} {row['median']:8.4f} {row['min']:8.4f} {row['max']:8.4f} "
            f"{100 * row['gap']:+7.2f} {row['seconds']:7.1f} {verdict}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", nargs="+", choices=list(JOBS), default=list(JOBS))
    p.add_argument("--candidates", nargs="+", choices=list(CANDIDATES), default=list(CANDIDATES))
    p.add_argument("--seeds", "--repeats", type=int, default=3, help="seeds per figure (medians)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    add_common_options(p, quick_help="CI: digits for 4 epochs, 2 candidates, 1 seed", repeats=False)
    args = p.parse_args()
    jobs, candidates, seeds = args.jobs, args.candidates, list(range(args.seeds))
    extra = list(args.set)
    if args.quick:
        jobs, candidates, seeds = ["digits"], ["defaults", "fresh optimizer"], [0]
        extra.append("run.epochs=4")
    results = []
    with human_output(args), tempfile.TemporaryDirectory(prefix="vcdl-defaults-") as tmp:
        for job in jobs:
            results.append(bench(job, candidates, seeds, extra, Path(tmp)))
        for r in results:
            print_job(r)
        wins = [c for c in candidates if all(r["met"][c] for r in results)]
        print(f"\ncandidates within the target on every job: {', '.join(wins) or 'none'}")
    emit_summary("defaults", {"seeds": seeds, "results": results, "all_met": wins}, args)


if __name__ == "__main__":
    main()
