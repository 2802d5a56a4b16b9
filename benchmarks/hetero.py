"""Asynchronous against synchronous training on uneven fleets: a GPT on ``pytext``.

A decoder-only transformer (4 blocks, width 208, 4 heads: 2.17M parameters)
learns the Python language reference byte by byte (``pytext``; the first
``--text`` fraction of it, the last 10 % of that held out). 4 workers, at
the heterogeneity levels

    H0 = (1, 1, 1, 1)   H1 = (1, 1, 1, 0.5)   H2 = (1, 0.75, 0.5, 0.25)   H3 = (1, 0.5, 0.25, 0.125)

(speeds emulated, ``cluster.speeds``: a worker of speed s waits after each
batch so that its wall time per batch is 1/s of its own measured pace; every
figure below is from emulated speeds). Every contender trains the same
tokens: ``--epochs`` passes over the same rows in 4 shards an epoch, the
same model, initialization, AdamW and learning rate, 16 rows of 128 tokens
per worker step (64 for one process):

- ``one process``: plain PyTorch at the global batch (speeds do not apply);
- ``synchronous``: merge rule ``average``: every shard of an epoch trains
  from the epoch's first version and the epoch's results are averaged, a
  barrier per epoch (local SGD, synchronous DiLoCo without outer momentum);
- ``defaults``: the config names only the data, model, optimizer and
  learning rate (vcdl's default merge: ``vc_asgd``, α 0.5 constant);
- ``delta``, ``diloco``, ``diloco_async``: those merge rules, otherwise the
  defaults.

For each: the final test loss (nats per byte), the wall seconds from the
run's first attempt to the first evaluated version at or below the
synchronous contender's final loss (evaluations are per epoch, so this is
resolved to an epoch's barrier), the fastest worker's busy fraction (its
attempts' ledger time over the span from the first attempt to the last
version) and the mean staleness of the merged results. Medians over seeds.
``defaults_sized`` is the defaults with ``cluster.sizing = "throughput"``
(shards sized by each worker's measured throughput, docs/uneven-fleets.md);
``defaults_overlap`` and ``defaults_sized_overlap`` add
``cluster.overlap_epochs`` (an epoch's shards start in the previous one's tail).

    python -m benchmarks.hetero                       # H0-H3, 3 seeds
    python -m benchmarks.hetero --levels H0 H3 --seeds 1
    python -m benchmarks.hetero --quick               # CI: a small GPT, H3, 3 contenders
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import add_common_options, emit_summary, human_output, median
from vcdl.config import RunConfig
from vcdl.config_files import load_config
from vcdl.data import write_arrays
from vcdl.data.builtin import TEXT_VOCAB, pytext_bytes
from vcdl.data.importers import text_splits
from vcdl.ledger import attempt_timings
from vcdl.runtime import open_ledger, open_store
from vcdl.worker.speed import SPEED_KEY

LEVELS: dict[str, tuple[float, ...]] = {
    "H0": (1.0, 1.0, 1.0, 1.0),
    "H1": (1.0, 1.0, 1.0, 0.5),
    "H2": (1.0, 0.75, 0.5, 0.25),
    "H3": (1.0, 0.5, 0.25, 0.125),
}
SYNC = "synchronous"
# Each contender's overrides on top of the config of only data, model, optimizer, lr.
CONTENDERS: dict[str, list[str]] = {
    SYNC: ["merge.rule=average"],
    "defaults": [],
    "defaults_sized": ["cluster.sizing=throughput"],
    "defaults_overlap": ["cluster.overlap_epochs=true"],
    "defaults_sized_overlap": ["cluster.sizing=throughput", "cluster.overlap_epochs=true"],
    "delta": ["merge.rule=delta"],
    "diloco": ["merge.rule=diloco"],
    "diloco_async": ["merge.rule=diloco_async"],
}

CONFIG = """\
[run]
name = "hetero"
epochs = {epochs}

[data]
name = "{data}"
shards = 4
eval_batch_size = 256

[model]
factory = "gpt"
kwargs = {{ layers = {layers}, heads = 4, width = {width} }}

[train]
objective = "causal_lm"
optimizer = "adamw"
lr = 3e-3
batch_size = 16

[cluster]
workers = 4
"""


# --- the figures of one run, from its ledger rows (pure) ---------------------


def time_to(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """The first time at which the loss is at or below ``target``; None if never."""
    for t, loss in sorted(curve):
        if loss <= target:
            return t
    return None


def busy_fractions(
    spans: Sequence[tuple[str, float, float, float]], start: float, end: float
) -> dict[str, tuple[float, float]]:
    """Per worker: (its speed, the fraction of [start, end] its attempts held it).

    ``spans``: (worker, speed, attempt start, attempt end), seconds. Overlapping
    attempts of one worker (Dask re-ran one) count once.
    """
    by: dict[str, list[tuple[float, float]]] = defaultdict(list)
    speed: dict[str, float] = {}
    for worker, s, a, b in spans:
        by[worker].append((max(a, start), min(b, end)))
        speed[worker] = s
    out = {}
    for worker, intervals in by.items():
        held, reach = 0.0, start
        for a, b in sorted(intervals):
            a = max(a, reach)
            if b > a:
                held += b - a
                reach = b
        out[worker] = (speed[worker], held / (end - start) if end > start else 0.0)
    return out


def fastest_busy(fractions: Mapping[str, tuple[float, float]]) -> float | None:
    """The busy fraction of the fastest worker (the mean over ties: at H0 all are fastest)."""
    if not fractions:
        return None
    top = max(s for s, _ in fractions.values())
    busy = [b for s, b in fractions.values() if s == top]
    return sum(busy) / len(busy)


def verdicts(level: str, table: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Issue 51's targets at one level, from its table of medians.

    Best asynchronous final loss ≤ the synchronous contender's and within 1 %
    of one process; at H3 also its time to the synchronous final loss ≤ 0.5×
    the synchronous run's, and the fastest worker busy ≥ 90 %.
    """
    asyn = {k: v for k, v in table.items() if k not in (SYNC, "one process")}
    best = min(asyn, key=lambda k: asyn[k]["loss"])
    b, sync, one = asyn[best], table[SYNC], table["one process"]
    out: dict[str, Any] = {
        "best": best,
        "best_not_worse_than_sync": b["loss"] <= sync["loss"],
        "best_gap_to_one_process": round((b["loss"] - one["loss"]) / one["loss"], 4),
    }
    out["within_1pct"] = out["best_gap_to_one_process"] <= 0.01
    if level == "H3":
        ratios = [v["time_ratio"] for v in asyn.values() if v.get("time_ratio") is not None]
        out["best_time_ratio"] = min(ratios) if ratios else None
        out["time_ratio_met"] = bool(ratios) and min(ratios) <= 0.5
        busy = [v["fastest_busy"] for v in asyn.values() if v.get("fastest_busy") is not None]
        out["best_fastest_busy"] = max(busy) if busy else None
        out["busy_met"] = bool(busy) and max(busy) >= 0.9
    return out


# --- runs ---------------------------------------------------------------------


def make_text(store_url: str, name: str, fraction: float) -> None:
    """The first ``fraction`` of pytext as a data set of 129-token rows."""
    data = pytext_bytes()
    part = data[: int(len(data) * fraction)]
    write_arrays(
        open_store(store_url),
        name,
        text_splits(part, 128, 0.1),
        source=f"the first {fraction:g} of pydoc_data.topics ({len(part)} bytes)",
        hints={"vocab_size": TEXT_VOCAB, "context_length": 128},
    )


def run_figures(cfg: RunConfig) -> dict[str, Any]:
    """Final loss, loss curve, busy fractions and staleness of a finished run."""
    assert cfg.ledger.url is not None and cfg.run.name is not None
    ledger = open_ledger(cfg.ledger.url)
    name = cfg.run.name
    attempts = ledger.attempts(name)
    versions = {v.number: v for v in ledger.versions(name)}
    start = min(a.started_at.timestamp() for a in attempts)
    end = max(v.created_at.timestamp() for v in versions.values())
    curve = [
        (versions[e.version].created_at.timestamp() - start, e.loss)
        for e in ledger.evaluations(name)
        if e.split == "test" and e.loss is not None and e.version in versions and e.version > 0
    ]
    spans = [
        (
            a.worker,
            float(attempt_timings(a).get(SPEED_KEY, 1.0)),
            a.started_at.timestamp(),
            a.finished_at.timestamp(),
        )
        for a in attempts
        if a.finished_at is not None
    ]
    stale = [v.staleness for v in versions.values() if v.staleness is not None]
    final = max(curve)[1] if curve else float("nan")
    return {
        "loss": final,
        "curve": sorted(curve),  # unrounded: a rounded final loss can miss itself
        "fastest_busy": fastest_busy(busy_fractions(spans, start, end)),
        "staleness": sum(stale) / len(stale) if stale else None,
        "span_s": end - start,
    }


def vcdl_run(cfg: RunConfig, home: Path) -> dict[str, Any]:
    from vcdl import api

    t = time.perf_counter()
    summary = api.train(cfg, home=home)
    wall = time.perf_counter() - t
    if summary["state"] != "completed":
        raise RuntimeError(f"run {cfg.run.name} ended {summary['state']}")
    return {**run_figures(cfg.with_locations(home)), "wall_s": wall}


def level_table(
    rows: Mapping[str, list[dict[str, Any]]], one: list[float]
) -> dict[str, dict[str, Any]]:
    """Medians per contender, with times to the synchronous contender's final loss."""
    sync_loss = median(r["loss"] for r in rows[SYNC])
    table: dict[str, dict[str, Any]] = {"one process": {"loss": round(median(one), 4)}}
    # Each synchronous run's own time to the median synchronous loss; a run that
    # ended above it counts with its end (never reached sooner).
    sync_time = median(time_to(r["curve"], sync_loss) or r["curve"][-1][0] for r in rows[SYNC])
    for name, runs in rows.items():
        times = [time_to(r["curve"], sync_loss) for r in runs]
        reached = [t for t in times if t is not None]
        busy = [r["fastest_busy"] for r in runs if r["fastest_busy"] is not None]
        stale = [r["staleness"] for r in runs if r["staleness"] is not None]
        t_med = median(reached) if len(reached) * 2 > len(runs) else None
        table[name] = {
            "loss": round(median(r["loss"] for r in runs), 4),
            "loss_min": round(min(r["loss"] for r in runs), 4),
            "loss_max": round(max(r["loss"] for r in runs), 4),
            "time_to_sync_s": None if t_med is None else round(t_med, 1),
            "time_ratio": None if t_med is None else round(t_med / sync_time, 3),
            "fastest_busy": round(median(busy), 3) if busy else None,
            "staleness": round(median(stale), 2) if stale else None,
            "span_s": round(median(r["span_s"] for r in runs), 1),
            "wall_s": round(median(r["wall_s"] for r in runs), 1),
        }
    return table


def _formatter(row: Mapping[str, Any]) -> Any:
    def f(key: str, fmt: str) -> str:
        return "-" if row.get(key) is None else format(row[key], fmt)

    return f


def print_level(level: str, table: Mapping[str, Mapping[str, Any]], v: Mapping[str, Any]) -> None:
    speeds = ", ".join(f"{s:g}" for s in LEVELS[level])
    print(f"\n{level} = ({speeds}), speeds emulated: test loss (nats/byte), medians")
    print(
        f"{'':14} {'loss':>7} {'min':>7} {'max':>7} {'to sync s':>9} {'ratio':>6} "
        f"{'busy':>5} {'stale':>5} {'span s':>7}"
    )
    for name, r in table.items():
        f = _formatter(r)
        print(
            f"{name:14} {r['loss']:7.4f} {f('loss_min', '7.4f'):>7} {f('loss_max', '7.4f'):>7} "
            f"{f('time_to_sync_s', '9.1f'):>9} {f('time_ratio', '6.2f'):>6} "
            f"{f('fastest_busy', '5.2f'):>5} {f('staleness', '5.2f'):>5} {f('span_s', '7.1f'):>7}"
        )
    gap = 100 * v["best_gap_to_one_process"]
    line = (
        f"best asynchronous: {v['best']}, not worse than synchronous: "
        f"{'met' if v['best_not_worse_than_sync'] else 'MISSED'}; {gap:+.2f} % of one process "
        f"(target <= 1 %): {'met' if v['within_1pct'] else 'MISSED'}"
    )
    if level == "H3":
        line += (
            f"; time to sync's loss {v['best_time_ratio']} x sync's (target <= 0.5): "
            f"{'met' if v['time_ratio_met'] else 'MISSED'}; fastest busy "
            f"{v['best_fastest_busy']} (target >= 0.9): {'met' if v['busy_met'] else 'MISSED'}"
        )
    print(line)


def main() -> None:
    from benchmarks.rules import one_process

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--levels", nargs="+", choices=list(LEVELS), default=list(LEVELS))
    p.add_argument("--contenders", nargs="+", choices=list(CONTENDERS), default=list(CONTENDERS))
    p.add_argument("--seeds", "--repeats", type=int, default=3, help="seeds per figure (medians)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--text", type=float, default=0.4, help="fraction of pytext trained on")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    add_common_options(
        p,
        quick_help="CI: a 2-block GPT of width 64, 5 %% of the text, H3, 3 contenders, 1 seed",
        repeats=False,
    )
    args = p.parse_args()
    levels, contenders, seeds = args.levels, args.contenders, list(range(args.seeds))
    layers, width, epochs, text = 4, 208, args.epochs, args.text
    if args.quick:
        levels, contenders, seeds = ["H3"], [SYNC, "defaults", "diloco_async"], [0]
        layers, width, epochs, text = 2, 64, 2, 0.05
    if SYNC not in contenders:
        p.error(f"--contenders must include {SYNC!r}: every time is measured against it")
    data = f"pytext-{text:g}"
    results: dict[str, Any] = {}
    with human_output(args), tempfile.TemporaryDirectory(prefix="vcdl-hetero-") as tmp:
        home = Path(tmp)
        toml = home / "hetero.toml"
        toml.write_text(CONFIG.format(epochs=epochs, data=data, layers=layers, width=width))
        base = load_config(toml, args.set).with_locations(home)
        assert base.store.url is not None
        make_text(base.store.url, data, text)
        one = [one_process(base.updated(run={"seed": s}), "loss")[0] for s in seeds]
        print(f"one process: {one}", flush=True)
        for level in levels:
            rows: dict[str, list[dict[str, Any]]] = {}
            speeds = "[" + ",".join(f"{s:g}" for s in LEVELS[level]) + "]"
            for name in contenders:
                rows[name] = []
                for seed in seeds:
                    over = [*args.set, *CONTENDERS[name], f"cluster.speeds={speeds}"]
                    cfg = load_config(toml, [*over, f"run.seed={seed}"])
                    run = f"hetero-{level}-{name}-s{seed}"
                    rows[name].append(vcdl_run(cfg.updated(run={"name": run}), home))
                    r = rows[name][-1]
                    # Every run's figures as they come: a later failure loses none.
                    print(f"[{level}] {name} seed {seed}: {json.dumps(r)}", flush=True)
            table = level_table(rows, one)
            v = verdicts(level, table)
            results[level] = {"speeds": LEVELS[level], "table": table, "targets": v}
        for level, r in results.items():
            print_level(level, r["table"], r["targets"])
    model = {"layers": layers, "width": width, "heads": 4}
    figures = {"model": model, "epochs": epochs, "text": text, "seeds": seeds, "levels": results}
    emit_summary("hetero", {**figures, "speeds_emulated": True}, args)


if __name__ == "__main__":
    main()
