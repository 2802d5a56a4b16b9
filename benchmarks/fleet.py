"""How many workers one driver keeps busy: the real driver and I/O, with training simulated.

Each attempt goes through the real path -- the ``train-shard`` Prefect task
on a Dask worker, the claim in the ledger, the base read from the Zarr
store, the result written back, the driver's streamed merge and its
compare-and-swap -- but its training is a sleep of ``--attempt-seconds``
(``vcdl.models.synthetic``: a model of ``--params`` float32 parameters whose
"training" moves every weight by a fixed step). So a 2-core machine can
stand in for a fleet: what is measured is everything around the training.

``--workers N`` training slots are Dask worker processes (``--processes``,
default up to 8) with N / processes threads each; each epoch has
``--shards-per-worker`` × N shards. Reported, per N:

* utilization = Σ training seconds of merged attempts ÷ (N × wall), wall
  from the driver's first submission to the last merge (what
  ``benchmarks/overhead.py`` measures for 2 workers);
* merges per second over the same wall;
* the driver process's CPU (user + system seconds ÷ wall; the Dask scheduler
  runs in it) and its peak resident memory;
* the mean seconds per phase of a merged attempt and of its merge (from the
  ledger's ``attempt.timings``);
* the driver machine's CPU seconds per attempt over the same window: the
  driver process (Dask scheduler, Prefect flow engine, ledger, merges) and
  the Prefect API server (a child process), sampled every 0.5 s;
* a projection from those costs, for workers on machines of their own (here
  they share the driver's cores): the workers this machine's cores could
  serve (cores ÷ CPU seconds per attempt × attempt seconds) and the workers
  the serial merge could (attempt seconds ÷ seconds per merge), the smaller
  of the two. A projection, not a measurement: say so wherever it is quoted.

Options: ``--workers 8 32 64`` (several: one run each), ``--attempt-seconds
30``, ``--params 25e6``, ``--epochs 2``, ``--set KEY=VALUE`` (config
overrides, as ``vcdl train --set``), and the common ones of
``benchmarks/harness.py`` (``--quick``, ``--json``, ``--out``; no ``--repeats``:
each N is one run of ``--epochs`` epochs whose figures are over all of its
attempts -- run the command again for a spread).
``--real CONFIG`` trains a real config instead of sleeping (for a GPU
machine: its own model, data and objective; ``--workers`` as above); it adds
the device that trained, the training samples per second of a slot and the
run's test metrics, so runs on different devices compare side by side
(``benchmarks/gpu.sh``).

Target (issue 33): >= 64 workers at >= 90 % utilization with 30-s attempts and
25M parameters, driven from this 2-core machine; the largest N at >= 90 % is
reported.

    python -m benchmarks.fleet --workers 8 32 64 --attempt-seconds 30 --params 25e6
    python -m benchmarks.fleet --quick        # CI: 4 workers, 2-s attempts, 1M parameters
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import resource
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import add_common_options, emit_summary, human_output
from benchmarks.overhead import dispatch_times
from benchmarks.sleeper import sleeper_config, write_sleeper_data
from vcdl.config import RunConfig, parse_config
from vcdl.config_files import apply_overrides, load_config
from vcdl.ledger.models import FOLDED_CHECKSUM

TARGET = 0.90
MERGE_PHASES = ("assimilator_read_result", "assimilator_read_head", "assimilator_merge")


def make_config(args: argparse.Namespace, workers: int, home: Path) -> RunConfig:
    processes = min(workers, args.processes)
    threads = math.ceil(workers / processes)
    shards = args.shards_per_worker * processes * threads
    if args.real:
        cfg = load_config(args.real, [f"data.shards={shards}", *args.set])
    else:
        sim = sleeper_config(
            f"fleet-{workers}", args.epochs, shards, args.params, args.attempt_seconds
        )
        cfg = parse_config(apply_overrides(sim, args.set))
    cfg = cfg.updated(
        run={"name": f"fleet-{workers}"},
        cluster={"workers": processes, "threads_per_worker": threads},
    )
    return cfg.with_locations(home)


class CpuSampler:
    """CPU seconds of the driver process and of its Prefect API server, sampled.

    The ephemeral Prefect API runs in a child process (uvicorn) that
    ``getrusage`` does not see until it exits. Both are read every ``every``
    seconds so the costs can be taken over the steady window (first
    submission to last merge), without the server's start-up.
    """

    def __init__(self, every: float = 0.5) -> None:
        import psutil

        self._me = psutil.Process()
        self._every = every
        self._server: Any = None
        self.samples: list[tuple[float, float, float]] = []  # (time, driver, server)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fleet-cpu", daemon=True)

    def _server_cpu(self) -> float:
        import psutil

        if self._server is None:
            for child in self._me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if "uvicorn" in " ".join(child.cmdline()):
                        self._server = child
                        break
        if self._server is None:
            return 0.0
        try:
            t = self._server.cpu_times()
        except Exception:  # psutil.Error: the server is gone
            return float("nan")
        return float(t.user + t.system)

    def _loop(self) -> None:
        while not self._stop.wait(self._every):
            t = self._me.cpu_times()
            self.samples.append((time.time(), t.user + t.system, self._server_cpu()))

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> tuple[float, float]:
        """CPU seconds of (driver, API server) from ``start`` to ``end``, nearest samples."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return float("nan"), float("nan")
        (_, d0, s0), (_, d1, s1) = inside[0], inside[-1]
        return d1 - d0, s1 - s0


def projection(r: dict[str, Any], attempt_seconds: float, cores: int) -> dict[str, Any]:
    """How many workers one driver machine could serve, from this run's per-attempt costs.

    Where the workers run on their own machines, the driver's machine pays
    only the driver process (Dask scheduler, ledger, merges) and the Prefect
    API server per attempt; its ``cores`` then cap attempts per second, and
    the serial merge caps merges per second at 1 ÷ its mean seconds. Each
    worker finishes an attempt every ``attempt_seconds``, so N workers ask
    for N ÷ attempt_seconds a second.
    """
    per_attempt = r["driver_cpu_s_per_attempt"] + r["api_cpu_s_per_attempt"]
    merge_s = sum(v for k, v in r["phases"].items() if k.startswith("assimilator"))
    # None where a cost measured nothing: it sets no limit.
    by_cpu = round(cores / per_attempt * attempt_seconds) if per_attempt > 0 else None
    by_merge = round(attempt_seconds / merge_s) if merge_s > 0 else None
    bounds = [b for b in (by_cpu, by_merge) if b is not None]
    return {
        "cores": cores,
        "workers_by_cpu": by_cpu,
        "workers_by_merge": by_merge,
        "max_workers": min(bounds) if bounds else None,
    }


def run(args: argparse.Namespace, workers: int, home: Path) -> dict[str, Any]:
    from vcdl import api
    from vcdl.ledger import attempt_timings
    from vcdl.runtime import RunRef, open_ledger
    from vcdl.views.audit import audit_run

    cfg = make_config(args, workers, home)
    if not args.real:
        write_sleeper_data(cfg, "benchmarks/fleet.py: one row per shard")
    assert cfg.ledger.url is not None and cfg.run.name is not None
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    started = time.time()
    with dispatch_times() as submits, CpuSampler() as cpu_use:
        summary = api.train(cfg, home=home)
    total = time.time() - started
    usage1 = resource.getrusage(resource.RUSAGE_SELF)
    if summary["state"] != "completed":
        raise RuntimeError(f"run {cfg.run.name} ended {summary['state']}")
    ledger = open_ledger(cfg.ledger.url)
    attempts = ledger.attempts(cfg.run.name)
    merged = [a for a in attempts if a.state == "merged"]
    versions = [v for v in ledger.versions(cfg.run.name) if v.subtask_id is not None]
    # merge.fold: versions merged with later ones in one pass, never written.
    folded = sum(1 for v in versions if v.checksum == FOLDED_CHECKSUM)
    problems = audit_run(RunRef.from_config(cfg))  # the ledger and store agree, as after any run
    first = min(t for t, _, _ in submits)
    last = max(v.created_at.timestamp() for v in versions)
    wall = last - first
    slots = cfg.cluster.workers * cfg.cluster.threads_per_worker
    train_s = sum(a.train_seconds or 0.0 for a in merged)
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    samples = sum(a.samples or 0 for a in merged)
    driver_window, api_window = cpu_use.between(first, last)
    phases: dict[str, list[float]] = {}
    for a in merged:
        for k, v in attempt_timings(a).items():
            phases.setdefault(k, []).append(v)
    return {
        "workers": slots,
        "processes": cfg.cluster.workers,
        "threads_per_process": cfg.cluster.threads_per_worker,
        "attempt_seconds": None if args.real else args.attempt_seconds,
        "params": None if args.real else int(args.params),
        "overrides": list(args.set),
        "epochs": cfg.run.epochs,
        "shards_per_epoch": cfg.data.shards,
        "merged": len(merged),
        "attempts": len(attempts),
        "utilization": round(train_s / (slots * wall), 4),
        "merges_per_s": round(len(versions) / wall, 3),
        "versions_folded": folded,
        "audit_problems": problems,
        "wall_s": round(wall, 1),
        "total_s": round(total, 1),
        "driver_cpu_per_wall": round(cpu / total, 3),
        "driver_peak_rss_gb": round(usage1.ru_maxrss * 1024 / 1e9, 2),
        "driver_cpu_s_per_attempt": round(driver_window / len(attempts), 4),
        "api_cpu_s_per_attempt": round(api_window / len(attempts), 4),
        "phases": {k: round(statistics.mean(v), 4) for k, v in sorted(phases.items())},
        **(real_figures(cfg, summary, samples, train_s) if args.real else {}),
    }


def real_figures(
    cfg: RunConfig, summary: dict[str, Any], samples: int, train_s: float
) -> dict[str, Any]:
    """What a real run adds: where it trained, how fast a slot trained, what it learned."""
    import torch

    from vcdl.worker.loop import resolve_device

    device = resolve_device(cfg.train.device)
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "amp": cfg.train.amp,
        "samples_per_train_s": round(samples / train_s, 1) if train_s else None,
        "test_loss": summary.get("test_loss"),
        "test_metrics": summary.get("test_metrics", {}),
    }


def print_run(r: dict[str, Any]) -> None:
    print(
        f"N={r['workers']:4} ({r['processes']} x {r['threads_per_process']}): utilization "
        f"{100 * r['utilization']:.1f} %, {r['merges_per_s']:.2f} merges/s, wall {r['wall_s']} s, "
        f"driver CPU {r['driver_cpu_per_wall']:.2f} cores, peak {r['driver_peak_rss_gb']} GB"
        + (f", {r['versions_folded']} versions folded" if r.get("versions_folded") else ""),
        flush=True,
    )
    print(
        f"  driver machine, CPU seconds an attempt: driver process "
        f"{r['driver_cpu_s_per_attempt']:.3f}, Prefect API server {r['api_cpu_s_per_attempt']:.3f}",
        flush=True,
    )
    if "projection" in r:
        p = r["projection"]
        print(
            f"  projected, workers on their own machines: {p['max_workers']} workers "
            f"({p['workers_by_cpu']} by the driver's {p['cores']} cores, "
            f"{p['workers_by_merge']} by the serial merge)",
            flush=True,
        )
    if "device" in r:
        print(
            f"  trained on {r['device']} (amp {r['amp']}): {r['samples_per_train_s']} samples/s "
            f"a slot, test loss {r['test_loss']}",
            flush=True,
        )
    attempt = {k: v for k, v in r["phases"].items() if not k.startswith("assimilator")}
    merge = {k: v for k, v in r["phases"].items() if k.startswith("assimilator")}
    for label, part in (("  attempt", attempt), ("  merge", merge)):
        order = sorted(part.items(), key=lambda kv: -kv[1])
        print(f"{label} phases, mean s: " + ", ".join(f"{k} {v:.3f}" for k, v in order))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[8, 32, 64])
    p.add_argument("--processes", type=int, default=8, help="Dask worker processes (at most)")
    p.add_argument("--attempt-seconds", type=float, default=30.0)
    p.add_argument("--params", type=float, default=25e6)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--shards-per-worker", type=int, default=2)
    p.add_argument("--real", metavar="CONFIG", help="train this config instead of sleeping")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override, as vcdl train --set (e.g. merge.result_precision=int8_delta)",
    )
    add_common_options(p, quick_help="CI: 4 workers, 2-s attempts, 1M params", repeats=False)
    args = p.parse_args()
    if args.quick:
        args.workers, args.attempt_seconds, args.params, args.processes = [4], 2.0, 1e6, 2
    # The sleeper is no built-in: its import path is allowed here, besides
    # whatever the environment already allows (docs/configuration.md).
    allowed = [p for p in os.environ.get("VCDL_ALLOW_IMPORTS", "").split(",") if p.strip()]
    os.environ["VCDL_ALLOW_IMPORTS"] = ",".join([*allowed, "vcdl.models.synthetic"])
    results = []
    # One directory for every N: the first run's home holds the ephemeral
    # Prefect server's database, which the process keeps using afterwards.
    with human_output(args), tempfile.TemporaryDirectory(prefix="vcdl-fleet-") as tmp:
        for n in args.workers:
            r = run(args, n, Path(tmp) / f"n{n}")
            if not args.real:
                r["projection"] = projection(r, args.attempt_seconds, os.cpu_count() or 1)
            results.append(r)
            print_run(r)
    met = [r["workers"] for r in results if r["utilization"] >= TARGET]
    verdict = {
        "largest_n_at_90": max(met) if met else None,
        "target_met": any(r["workers"] >= 64 and r["utilization"] >= TARGET for r in results),
    }
    if not args.real:
        with human_output(args):
            print(
                f"largest N at >= {100 * TARGET:.0f} % utilization: {verdict['largest_n_at_90']}; "
                f">= 64 workers at >= 90 %: {'met' if verdict['target_met'] else 'MISSED'}"
            )
    emit_summary("fleet", {"results": results, **verdict}, args)


if __name__ == "__main__":
    main()
