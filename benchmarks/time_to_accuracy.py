"""Time to accuracy: vcdl vs one PyTorch process vs DDP, fault-free and under kills.

Part (a), fault-free, ``cnn1d`` width 64: wall seconds from time zero to 95%
and 97% test accuracy for vcdl (2 Dask workers, 8 shards), one plain PyTorch
process and DistributedDataParallel (gloo, 2 processes under ``torchrun``).
Part (b), a seeded kill schedule (a Poisson process, one SIGKILL every
``--kill-interval`` seconds on average, the same kill times after time zero
for both contenders), ``cnn1d`` width 256: wall seconds to 98% and the
accuracy after the last epoch for vcdl and for ``torchrun --max-restarts``
DDP that checkpoints every epoch.

Method (the same for every contender):

* Data: vcdl's built-in MNIST-1D, generated once into ``--cache-dir`` as an
  ``.npz``; vcdl imports it into each run's store, the plain contenders read
  the arrays: every contender trains and is tested on the same samples.
* Model and optimizer: ``vcdl.models.cnn1d`` seeded as vcdl seeds it, Adam
  3e-3 (examples/mnist1d.toml), one torch thread per process.
* Batch: the same *global* batch for every contender, the samples the
  whole fleet consumes per optimizer step: vcdl's ``train.batch_size`` is
  per worker (50 in examples/mnist1d.toml, 2 workers: 100 in all); one
  process steps on 100; DDP splits 100 over its 2 ranks (50 each, their
  gradients averaged, as vcdl's merge averages its workers' changes).
  Every training process of a 2-process contender steps on 50 samples.
* Time zero = the first hand-out of training work after every process is up:
  vcdl, the driver's first shard submission (marked in the driver by
  wrapping ``flows.epoch.EpochExecutor.submit``; vcdl runs on the LocalCluster
  it starts for every run, as a user gets it, whose workers have imported
  torch/vcdl/prefect before it, as DDP's ranks have); one
  process and DDP, rank 0's first training step (after import, process-group
  set-up and data loading). Start-up before time zero is not counted for
  anyone; each contender's total wall time including start-up is printed too.
* Accuracy over time = durable model states with a time stamp, evaluated on
  the test split afterwards (untimed). vcdl: every version in the ledger
  (``created_at``). Fault-free one process and DDP: a copy of the weights
  kept in memory as often as vcdl makes versions (``shards`` per epoch).
  Under kills only what survives counts: DDP's per-epoch checkpoints on disk
  (their write time included: it is their fault-tolerance cost) and vcdl's
  versions. "Time to X%" is the first durable state at or above X.
* Kills: SIGKILL of one training process — a Dask worker process (not its
  nanny, which restarts it) or one of torchrun's two ranks (the agent
  restarts the group, which resumes from the last checkpoint). An event fires
  only while both of the contender's training processes are up, else it is
  recorded as skipped (a machine already down cannot be taken again); the
  victim is a seeded choice, the same sequence for both.
* Utilization (vcdl, part b) = Σ ``train_seconds`` of the training that
  reached a version ÷ (workers × seconds from time zero to the last merge):
  merged attempts', and the part of killed attempts kept in a checkpoint that
  a merged attempt resumed (vcdl checkpoints every
  ``checkpoint_seconds_b`` of training in part b). Training lost to a kill
  after the last checkpoint does not count.
* Savings: ``vcdl.views.cost.cost_report`` on the part (b) vcdl run.
* Allocator: vcdl's workers set glibc's mmap and trim thresholds
  (vcdl/worker/allocator.py); one process and DDP run with glibc's defaults, as a
  plain script gets them. Part (a) also runs DDP with vcdl's thresholds
  (``ddp_tuned``, as glibc's environment variables) to show what that
  difference is worth.
* Contenders run one after another in each repeat (vcdl, any ``--vcdl-also``
  variants of it, one process in part a, DDP, DDP with vcdl's allocator);
  figures are medians over ``--repeats``. The machine is shared: timings
  are noisy.

    python -m benchmarks.time_to_accuracy            # full: ~12 min
    python -m benchmarks.time_to_accuracy --quick    # small sizes, ~3 min (CI)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from benchmarks.harness import add_common_options, emit_summary, human_output, median
from benchmarks.tta_common import (
    QUICK,
    Curve,
    Settings,
    cached_data,
    kill_schedule,
    run_config,
    time_to,
)
from benchmarks.tta_contenders import run_ddp, run_one_process, run_vcdl
from vcdl.config import RunConfig
from vcdl.worker.allocator import TUNED_ENV

__all__ = ["QUICK", "Settings", "contenders", "run_benchmark", "summary_line"]


# --------------------------------------------------------------------------
# The two parts
# --------------------------------------------------------------------------


def _median(values: Sequence[float | None]) -> float | None:
    """Median; a contender that never reached the target counts as infinitely slow."""
    vals = [float("inf") if v is None else v for v in values]
    m = median(vals) if vals else float("inf")
    return None if m == float("inf") else round(m, 2)


def _final(curve: Curve) -> float:
    return curve[-1][1] if curve else 0.0


def contenders(
    s: Settings, width: int, epochs: int, name: str, overrides: Sequence[str]
) -> tuple[RunConfig, dict[str, RunConfig]]:
    """The plain contenders' config, then vcdl's: "vcdl" and "vcdl <overrides>" per variant.

    vcdl's ``train.batch_size`` is per worker; the plain config's is the
    global batch, the workers' batches together (one process steps on it,
    DDP splits it over its ranks).
    """
    shipped = run_config(s, width, epochs, name, overrides)
    plain = shipped.updated(train={"batch_size": shipped.global_batch_size})
    return plain, {
        "vcdl": shipped,
        **{
            f"vcdl {v}": run_config(s, width, epochs, name, [*overrides, *v.split(",")])
            for v in s.variants
        },
    }


def part_a(s: Settings, npz: Path, work: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Fault-free time to the part (a) targets, medians over ``repeats_a``."""
    cfg, vcdls = contenders(s, s.width_a, s.epochs_a, "tta-a", s.overrides_a)
    snapshots = max(s.snapshots, cfg.data.shards)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in vcdls}
    ddps: dict[str, dict[str, str]] = {"ddp": {}}
    ddps |= {"ddp_tuned": TUNED_ENV} if s.tuned_ddp else {}
    runs |= {"one_process": [], **{name: [] for name in ddps}}
    for i in range(s.repeats_a):
        for j, (name, vcfg) in enumerate(vcdls.items()):
            runs[name].append(
                run_vcdl(vcfg, npz, work / f"a{i}-vcdl{j or ''}", events=[], seed=s.kill_seed)
            )
        runs["one_process"].append(run_one_process(cfg, npz, snapshots))
        for name, env in ddps.items():
            runs[name].append(
                run_ddp(
                    cfg,
                    npz,
                    work / f"a{i}-{name}",
                    checkpoint=False,
                    events=[],
                    seed=s.kill_seed,
                    snapshots_per_epoch=snapshots,
                    env_extra=env,
                )
            )
        for name, r in runs.items():
            log(f"(a) run {i + 1}/{s.repeats_a} {name}: {_brief(r[-1], s.targets_a)}")
    out: dict[str, Any] = {
        "width": s.width_a,
        "epochs": s.epochs_a,
        "repeats": s.repeats_a,
        "shards": cfg.data.shards,
        "lr": cfg.train.lr,
        "global_batch": cfg.train.batch_size,
        "worker_batch": vcdls["vcdl"].train.batch_size,
        "alpha": cfg.merge.alpha,
        "overrides": list(s.overrides_a),
        "variants": list(s.variants),
    }
    for name, rs in runs.items():
        out[name] = {
            **{
                f"time_to_{_pct(t)}": _median([time_to(r["curve"], t) for r in rs])
                for t in s.targets_a
            },
            "final_accuracy": median(_final(r["curve"]) for r in rs),
            "train_wall": _median([r["train_wall"] for r in rs]),
            "total_wall": _median([r["total_wall"] for r in rs]),
            "runs": rs,
        }
    return out


def part_b(s: Settings, npz: Path, work: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Time to ``target_b`` and final accuracy under the kill schedule."""
    cfg, vcdls = contenders(
        s, s.width_b, s.epochs_b, "tta-b", [f"fault.checkpoint_seconds={s.checkpoint_seconds_b}"]
    )
    events = kill_schedule(s)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in [*vcdls, "ddp"]}
    for i in range(s.repeats_b):
        for j, (name, vcfg) in enumerate(vcdls.items()):
            runs[name].append(
                run_vcdl(vcfg, npz, work / f"b{i}-vcdl{j or ''}", events=events, seed=s.kill_seed)
            )
        runs["ddp"].append(
            run_ddp(
                cfg,
                npz,
                work / f"b{i}-ddp",
                checkpoint=True,
                events=events,
                seed=s.kill_seed,
                snapshots_per_epoch=s.shards,
            )
        )
        for name, r in runs.items():
            log(f"(b) run {i + 1}/{s.repeats_b} {name}: {_brief(r[-1], (s.target_b,))}")
    out: dict[str, Any] = {
        "width": s.width_b,
        "epochs": s.epochs_b,
        "repeats": s.repeats_b,
        "kill_interval": s.kill_interval,
        "kill_seed": s.kill_seed,
        "global_batch": cfg.train.batch_size,
        "worker_batch": vcdls["vcdl"].train.batch_size,
        "schedule_first_10": [e.at for e in events[:10]],
        "variants": list(s.variants),
    }
    for name, rs in runs.items():
        out[name] = {
            f"time_to_{_pct(s.target_b)}": _median([time_to(r["curve"], s.target_b) for r in rs]),
            "final_accuracy": median(_final(r["curve"]) for r in rs),
            "train_wall": _median([r["train_wall"] for r in rs]),
            "total_wall": _median([r["total_wall"] for r in rs]),
            "kills": median(r["kills"] for r in rs),
            "runs": rs,
        }
        if name != "ddp":
            out[name] |= _vcdl_medians(rs)
    out["ddp"]["resumed_from_checkpoint"] = sum(r["resumed_from_checkpoint"] for r in runs["ddp"])
    return out


def _vcdl_medians(v: list[dict[str, Any]]) -> dict[str, Any]:
    """Utilization and savings of vcdl runs under kills, medians."""
    gaps = [r["savings_gap_points"] for r in v if r["savings_gap_points"] is not None]
    realized = [r["realized_savings"] for r in v if r["realized_savings"] is not None]
    return {
        "utilization": median(r["utilization"] for r in v),
        "savings_gap_points": median(gaps) if gaps else None,
        "spot_discount": v[0]["spot_discount"],
        "realized_savings": median(realized) if realized else None,
    }


def _pct(target: float) -> str:
    return f"{round(100 * target)}"


def _fmt(x: float | None, unit: str = "s") -> str:
    return "never" if x is None else f"{x:.1f}{unit}"


def _brief(r: dict[str, Any], targets: Sequence[float]) -> str:
    hits = ", ".join(f"{_pct(t)}% at {_fmt(time_to(r['curve'], t))}" for t in targets)
    extra = f", {r['kills']} kills" if r.get("kills") else ""
    return f"{hits}, final {_final(r['curve']):.4f}, train wall {r['train_wall']:.1f}s{extra}"


def verdicts(res: dict[str, Any], s: Settings) -> list[tuple[str, bool | None, str]]:
    """The targets of issue 6: (name, PASS/MISS/None = no verdict here, figures)."""
    out: list[tuple[str, bool | None, str]] = []
    if "a" in res:
        a, key = res["a"], f"time_to_{_pct(s.targets_a[0])}"
        vc = a["vcdl"][key]
        for name, label in (("ddp", ""), ("ddp_tuned", " with vcdl's allocator thresholds")):
            if name in a:
                ddp = a[name][key]
                ok = vc is not None and (ddp is None or vc <= ddp)
                out.append(
                    (
                        f"(a) vcdl time to {key[8:]}% <= DDP's{label}",
                        ok,
                        f"{_fmt(vc)} vs {_fmt(ddp)}",
                    )
                )
    if "b" in res:
        b, key = res["b"], f"time_to_{_pct(s.target_b)}"
        vc, ddp = b["vcdl"][key], b["ddp"][key]
        ok = vc is not None and (ddp is None or vc <= ddp / 2)
        out.append(
            (f"(b) vcdl time to {key[8:]}% <= half of torchrun's", ok, f"{_fmt(vc)} vs {_fmt(ddp)}")
        )
        u = b["vcdl"]["utilization"]
        # Reported, not judged: part (b)'s attempts train ~2 s, where the fixed
        # cost per attempt weighs more; issue 6 sets 85 % for ~5-s attempts,
        # and overhead.py --kill-every 15 measures that.
        out.append(
            (
                "(b) vcdl utilization (~2-s attempts; the 85% target is overhead.py's)",
                None,
                f"{100 * u:.1f}% (merged + salvaged training)",
            )
        )
        g = b["vcdl"]["savings_gap_points"]
        out.append(
            (
                "(b) realized savings within 5 points of the spot discount",
                None if g is None else g <= 5.0,
                "n/a"
                if g is None
                else f"gap {g:.2f} points "
                f"(discount {100 * b['vcdl']['spot_discount']:.1f}%, "
                f"realized {100 * b['vcdl']['realized_savings']:.1f}%)",
            )
        )
    return out


def run_benchmark(
    s: Settings, work: Path | None = None, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run the parts of ``s``; return every figure (curves, medians, verdicts)."""
    from vcdl.api import prepare_prefect

    npz = cached_data(s.cache_dir, s.samples)
    # Prefect's state stays with the cache (one warm ephemeral server for all runs).
    prepare_prefect(Path(s.cache_dir))
    res: dict[str, Any] = {"benchmark": "time_to_accuracy", "settings": asdict(s), "data": str(npz)}
    with contextlib.ExitStack() as stack:
        if work is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vcdl-tta-")))
        if "a" in s.parts:
            res["a"] = part_a(s, npz, work, log)
        if "b" in s.parts:
            res["b"] = part_b(s, npz, work, log)
    res["verdicts"] = [
        {"target": n, "result": None if ok is None else ("PASS" if ok else "MISS"), "figures": f}
        for n, ok, f in verdicts(res, s)
    ]
    return res


def print_report(res: dict[str, Any], s: Settings) -> None:
    if "a" in res:
        a = res["a"]
        keys = [f"time_to_{_pct(t)}" for t in s.targets_a]
        print(
            f"\n(a) fault-free, cnn1d width {a['width']}, {a['epochs']} epochs, global batch "
            f"{a['global_batch']} (vcdl: {a['worker_batch']} per worker), "
            f"medians of {a['repeats']} (seconds from time zero):"
        )
        head = "".join(f"{'to ' + k[8:] + '%':>10}" for k in keys)
        names = ["vcdl", *(f"vcdl {v}" for v in a.get("variants", [])), "one_process", "ddp"]
        names += ["ddp_tuned"] if "ddp_tuned" in a else []
        width = max(14, *(len(n) + 2 for n in names))
        print(f"{'contender':<{width}}{head}{'final acc':>11}{'train wall':>12}{'total wall':>12}")
        for name in names:
            r = a[name]
            cells = "".join(f"{_fmt(r[k]):>10}" for k in keys)
            print(
                f"{name:<{width}}{cells}{r['final_accuracy']:>11.4f}"
                f"{_fmt(r['train_wall']):>12}{_fmt(r['total_wall']):>12}"
            )
    if "b" in res:
        b = res["b"]
        k = f"time_to_{_pct(s.target_b)}"
        print(
            f"\n(b) kill schedule (SIGKILL every ~{b['kill_interval']:.0f}s, "
            f"seed {b['kill_seed']}), cnn1d width {b['width']}, {b['epochs']} epochs, global "
            f"batch {b['global_batch']} (vcdl: {b['worker_batch']} per worker), "
            f"medians of {b['repeats']}:"
        )
        names = ["vcdl", *(f"vcdl {v}" for v in b.get("variants", [])), "ddp"]
        width = max(14, *(len(n) + 2 for n in names))
        print(
            f"{'contender':<{width}}{'to ' + k[8:] + '%':>10}{'final acc':>11}{'kills':>7}"
            f"{'train wall':>12}{'total wall':>12}"
        )
        for name in names:
            r = b[name]
            print(
                f"{name:<{width}}{_fmt(r[k]):>10}{r['final_accuracy']:>11.4f}{r['kills']:>7.0f}"
                f"{_fmt(r['train_wall']):>12}{_fmt(r['total_wall']):>12}"
            )
        print(
            f"DDP restarts resumed from a checkpoint: {b['ddp']['resumed_from_checkpoint']}; "
            f"vcdl attempts: {b['vcdl']['runs'][0]['attempt_states']}"
        )
    print(
        "\ntime zero: vcdl = driver's first shard submission (workers up and warm); one process "
        "and DDP = rank 0's first training step. Accuracy = durable states evaluated afterwards."
    )
    for v in res["verdicts"]:
        print(f"{v['result'] or 'N/A'}: {v['target']}: {v['figures']}")


def summary_line(res: dict[str, Any]) -> dict[str, Any]:
    """The one-line JSON summary: medians and verdicts, no curves."""
    out: dict[str, Any] = {"benchmark": "time_to_accuracy", "samples": res["settings"]["samples"]}
    for part in ("a", "b"):
        if part in res:
            out[part] = {
                name: {k: v for k, v in r.items() if k != "runs"} if isinstance(r, dict) else r
                for name, r in res[part].items()
                if name != "schedule_first_10"
            }
    out["verdicts"] = {v["target"]: v["result"] for v in res["verdicts"]}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(
        p,
        quick_help="8 000 samples, small models (CI)",
        repeats_help="repeats of part (a) (default 3; quick 1)",
    )
    p.add_argument("--parts", default="ab", help="which parts: a, b or ab")
    p.add_argument("--repeats-b", type=int, help="repeats of part (b) (default 1)")
    p.add_argument("--kill-interval", type=float, help="mean seconds between kills (default 15)")
    p.add_argument("--kill-seed", type=int)
    p.add_argument("--cache-dir", help="where the data set is generated once")
    p.add_argument("--work-dir", help="keep every run's files here (default: a temp dir)")
    p.add_argument("--json-out", help="also write every figure (curves included) to this file")
    p.add_argument(
        "--no-tuned-ddp",
        action="store_true",
        help="part (a) without the DDP contender run with vcdl's allocator thresholds",
    )
    p.add_argument(
        "--set-a",
        action="append",
        metavar="KEY=VALUE",
        help="config override for part (a), every contender (e.g. train.lr=0.01); "
        "replaces the defaults when given",
    )
    p.add_argument(
        "--vcdl-also",
        action="append",
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="one more vcdl contender, run beside the shipped config in each part "
        "(e.g. merge.rule=delta); repeatable",
    )
    args = p.parse_args()
    s = QUICK if args.quick else Settings()
    if args.vcdl_also:
        s = replace(s, variants=tuple(args.vcdl_also))
    s = replace(s, parts=tuple(args.parts), tuned_ddp=not args.no_tuned_ddp)
    if args.set_a is not None:
        s = replace(s, overrides_a=tuple(args.set_a))
    for arg, name in (
        ("repeats", "repeats_a"),
        ("repeats_b", "repeats_b"),
        ("kill_interval", "kill_interval"),
        ("kill_seed", "kill_seed"),
        ("cache_dir", "cache_dir"),
    ):
        if getattr(args, arg) is not None:
            s = replace(s, **{name: getattr(args, arg)})
    work = Path(args.work_dir) if args.work_dir else None
    with human_output(args):
        res = run_benchmark(s, work, log=lambda m: print(m, flush=True))
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(res, indent=1))
        print_report(res, s)
    emit_summary("time_to_accuracy", summary_line(res), args)


if __name__ == "__main__":
    main()
