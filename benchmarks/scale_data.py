"""Data at scale (issue 32, parts b and c): bytes read per epoch, and worker memory.

A synthetic classification set (uint8 rows of ``--features`` values, 10
classes, each row its class's pattern plus noise) is written as an ``.npz``
and imported through vcdl's importer (:func:`vcdl.data.import_npz`), so it is
chunked like user data. Runs use ``data.cache_mb`` far below it, so every
attempt streams its shard from the store.

(b) **Bytes read per epoch ÷ split bytes**: one epoch at 8 and at 32 shards,
every attempt run by :func:`vcdl.worker.attempt.run_attempt` (ledger, store,
training); the sum of the attempts' ``data_bytes`` in the ledger over the
train split's stored bytes. Target ≤ 1.25. ``--rows-plan`` also measures
the row-permutation plan of before issue 32 (``data.plan = "rows"``).

(c) **Peak worker memory**: a fresh worker process (:func:`worker_main`,
``python -m benchmarks.scale_data --worker``) runs attempts on the large
set, another the same attempts on a small set (``--small-mb``, default 20);
the difference of their peak resident set sizes. Target ≤ 0.5 GB.

    python -m benchmarks.scale_data                # 2 GiB set, then deleted
    python -m benchmarks.scale_data --quick        # CI: 24 MiB vs 2 MiB, 2 and 4 shards
    python -m benchmarks.scale_data --json         # only the JSON summary

Prints the figures and a one-line JSON summary. :func:`measure` is what
``benchmarks/scale.py`` can call. No ``--repeats``: its figures are bytes
read and a peak resident size, not timings.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from benchmarks.harness import REPO, add_common_options, emit_summary, human_output

READ_TARGET = 1.25
MEMORY_TARGET = 0.5e9  # bytes above the small set's peak
CLASSES = 10


def write_synthetic_npz(path: Path, nbytes: int, features: int, seed: int = 0) -> int:
    """An ``.npz`` of ``x_train``/``y_train`` (about ``nbytes`` decoded) and a small test split.

    Returns the train rows. Rows are a per-class uint8 pattern plus uniform
    noise in [0, 64), so a model can learn them and they do not compress
    away. Written in slices of a memmapped array, never whole in memory.
    """
    row_bytes = features + 8  # x uint8, y int64
    rows = max(CLASSES * 10, nbytes // row_bytes)
    rng = np.random.default_rng(seed)
    proto = rng.integers(0, 192, (CLASSES, features), dtype=np.uint8)
    tmp = path.parent / f"{path.stem}-parts"
    tmp.mkdir(parents=True, exist_ok=True)
    x = np.lib.format.open_memmap(tmp / "x_train.npy", "w+", np.uint8, (rows, features))
    y = np.lib.format.open_memmap(tmp / "y_train.npy", "w+", np.int64, (rows,))
    step = 1 << 16
    for lo in range(0, rows, step):
        hi = min(rows, lo + step)
        labels = rng.integers(0, CLASSES, hi - lo)
        y[lo:hi] = labels
        x[lo:hi] = proto[labels] + rng.integers(0, 64, (hi - lo, features), dtype=np.uint8)
    x.flush()
    y.flush()
    del x, y
    test = max(CLASSES * 10, min(10_000, rows // 10))
    yt = rng.integers(0, CLASSES, test)
    xt = proto[yt] + rng.integers(0, 64, (test, features), dtype=np.uint8)
    np.save(tmp / "x_test.npy", xt)
    np.save(tmp / "y_test.npy", yt)
    # An .npz is a zip of .npy files: stored, not compressed, as np.savez does.
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for name in ("x_train", "y_train", "x_test", "y_test"):
            z.write(tmp / f"{name}.npy", f"{name}.npy")
    shutil.rmtree(tmp)
    return rows


def make_dataset(home: Path, name: str, nbytes: int, features: int) -> dict[str, Any]:
    """Import a synthetic set of about ``nbytes`` into ``home/store``; its figures."""
    from vcdl.data import import_npz
    from vcdl.runtime import open_store

    store = open_store(str(home / "store"))
    npz = home / f"{name}.npz"
    t = time.perf_counter()
    write_synthetic_npz(npz, nbytes, features)
    info = import_npz(store, npz, name=name)
    npz.unlink()
    group = store.open_group(f"datasets/{name}")
    stored = 0
    for f in info.splits["train"].arrays:
        array = group[f"train/{f}"]
        assert isinstance(array, zarr.Array)
        stored += int(array.nbytes_stored())
    return {
        "name": name,
        "rows": info.n_train,
        "rows_per_chunk": info.splits["train"].rows_per_chunk,
        "decoded_bytes": info.splits["train"].nbytes,
        "stored_bytes": int(stored),
        "import_seconds": time.perf_counter() - t,
    }


def run_config(home: Path, run: str, data: str, shards: int, plan: str, cache_mb: int) -> Any:
    from vcdl.config import parse_config

    return parse_config(
        {
            "run": {"name": run, "epochs": 1, "seed": 0},
            "data": {"name": data, "shards": shards, "plan": plan, "cache_mb": cache_mb},
            "model": {"factory": "mlp", "kwargs": {"hidden": [32]}},
            "train": {"batch_size": 500, "lr": 1e-3, "threads": 1},
        }
    ).with_locations(home)


def prepare(home: Path, run: str, data: str, shards: int, plan: str, cache_mb: int) -> None:
    """Create the run and its epoch-0 subtasks (what the driver does before dispatching)."""
    from vcdl.driver.runs import prepare_run

    cfg = run_config(home, run, data, shards, plan, cache_mb)
    ref, _, _ = prepare_run(cfg)
    ref.ledger().ensure_subtasks(ref.run, 0, shards)


def bytes_per_epoch(
    home: Path, data: dict[str, Any], shards: int, plan: str, cache_mb: int
) -> dict[str, Any]:
    """(b): one epoch of ``shards`` attempts in this process; the ledger's data_bytes summed."""
    from vcdl.runtime import RunRef
    from vcdl.worker.attempt import run_attempt

    run = f"read-{plan}-{shards}"
    prepare(home, run, data["name"], shards, plan, cache_mb)
    cfg = run_config(home, run, data["name"], shards, plan, cache_mb)
    ref = RunRef.from_config(cfg)
    t = time.perf_counter()
    losses = []
    for shard in range(shards):
        # Pinned to v0: nothing merges here, so no attempt waits for a merge.
        out = run_attempt(ref, 0, shard, base_version=0, config=cfg)
        losses.append(out.loss)
    attempts = ref.ledger().attempts(run, 0)
    read = sum(a.data_bytes or 0 for a in attempts)
    return {
        "shards": shards,
        "plan": plan,
        "data_bytes": read,
        "data_requests": sum(a.data_requests or 0 for a in attempts),
        "ratio": read / data["stored_bytes"],
        "seconds": time.perf_counter() - t,
        "last_loss": losses[-1],
    }


def worker_main(argv: list[str]) -> None:
    """A worker process: run the given attempts of a prepared run, print peak memory as JSON.

    ``--warmup RUN,DATA`` first runs shard 0 of another prepared run (a small
    set, the same settings), so every thread and library the worker uses
    exists. ``--limit-mb`` then caps the address space at what the process
    has mapped plus that many MiB (RLIMIT_AS): an attempt that tried to hold
    more fails with MemoryError, and the worker exits non-zero.
    """
    p = argparse.ArgumentParser(prog="scale_data --worker")
    p.add_argument("home", type=Path)
    p.add_argument("run")
    p.add_argument("data")
    p.add_argument("--shards", type=int, required=True)
    p.add_argument("--plan", default="blocks")
    p.add_argument("--cache-mb", type=int, required=True)
    p.add_argument("--attempts", default="0")
    p.add_argument("--warmup", default="")
    p.add_argument("--limit-mb", type=int, default=0)
    args = p.parse_args(argv)
    from vcdl.runtime import RunRef
    from vcdl.worker.attempt import run_attempt

    def attempt(run: str, data: str, shard: int) -> dict[str, Any]:
        cfg = run_config(args.home, run, data, args.shards, args.plan, args.cache_mb)
        # Pinned to v0: nothing merges here, so no attempt waits for a merge.
        out = run_attempt(RunRef.from_config(cfg), 0, shard, base_version=0, config=cfg)
        return {"shard": shard, "state": out.state, "loss": out.loss, "data": out.data_bytes}

    if args.warmup:
        warm_run, warm_data = args.warmup.split(",")
        attempt(warm_run, warm_data, 0)
    limit = None
    if args.limit_mb:
        limit = _status_bytes("VmSize") + (args.limit_mb << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    outs = [attempt(args.run, args.data, int(s)) for s in args.attempts.split(",")]
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a worker
    # forked from a big parent would report the parent's peak.
    peak = _status_bytes("VmHWM")
    print(json.dumps({"peak_rss": peak, "limit": limit, "attempts": outs}))


def _status_bytes(key: str) -> int:
    """A ``kB`` figure of ``/proc/self/status`` (Linux), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def run_worker(
    home: Path,
    run: str,
    data: str,
    shards: int,
    cache_mb: int,
    attempts: list[int],
    plan: str = "blocks",
    limit_mb: int = 0,
    warmup: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """Start a fresh worker process for ``attempts`` of a prepared run; its JSON report.

    Raises :class:`RuntimeError` with the worker's stderr if it fails.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    # One malloc arena per thread would reserve 64 MiB of address space each.
    env.setdefault("MALLOC_ARENA_MAX", "2")
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.scale_data",
        "--worker",
        str(home),
        run,
        data,
        f"--shards={shards}",
        f"--plan={plan}",
        f"--cache-mb={cache_mb}",
        f"--attempts={','.join(map(str, attempts))}",
        f"--limit-mb={limit_mb}",
        f"--warmup={','.join(warmup) if warmup else ''}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"worker failed ({proc.returncode}): {proc.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def peak_memory(
    home: Path, big: dict[str, Any], small: dict[str, Any], shards: int, cache_mb: int
) -> dict[str, Any]:
    """(c): the same worker, the same attempts, on the large and on the small set."""
    peaks = {}
    for label, data in (("small", small), ("large", big)):
        run = f"memory-{label}"
        prepare(home, run, data["name"], shards, "blocks", cache_mb)
        peaks[label] = run_worker(home, run, data["name"], shards, cache_mb, [0, 1])
    above = peaks["large"]["peak_rss"] - peaks["small"]["peak_rss"]
    return {
        "shards": shards,
        "attempts": 2,
        "small_peak_rss": peaks["small"]["peak_rss"],
        "large_peak_rss": peaks["large"]["peak_rss"],
        "above": above,
    }


def measure(
    home: Path,
    *,
    nbytes: int,
    small_bytes: int,
    features: int = 1000,
    shard_counts: tuple[int, ...] = (8, 32),
    cache_mb: int = 1,
    rows_plan: bool = False,
    quick: bool = False,
) -> dict[str, Any]:
    """Parts (b) and (c) in ``home`` (a scratch directory, left for the caller to delete)."""
    big = make_dataset(home, "scale-large", nbytes, features)
    small = make_dataset(home, "scale-small", small_bytes, features)
    reads = [bytes_per_epoch(home, big, s, "blocks", cache_mb) for s in shard_counts]
    if rows_plan:
        reads.append(bytes_per_epoch(home, big, shard_counts[0], "rows", cache_mb))
    memory = peak_memory(home, big, small, shard_counts[0], cache_mb)
    blocks = [r for r in reads if r["plan"] == "blocks"]
    return {
        "large": big,
        "small": small,
        "cache_mb": cache_mb,
        "reads": reads,
        "memory": memory,
        "read_target": READ_TARGET,
        "read_met": all(r["ratio"] <= READ_TARGET for r in blocks),
        "memory_target": MEMORY_TARGET,
        "memory_met": memory["above"] <= MEMORY_TARGET,
        "quick": quick,
    }


def report(r: dict[str, Any]) -> str:
    big, small, m = r["large"], r["small"], r["memory"]
    lines = [
        f"data set: {big['rows']:,} train rows, {big['decoded_bytes'] / 2**30:.2f} GiB decoded, "
        f"{big['stored_bytes'] / 2**30:.2f} GiB stored, {big['rows_per_chunk']} rows per chunk; "
        f"data.cache_mb = {r['cache_mb']}; small set {small['decoded_bytes'] / 2**20:.1f} MiB",
        "",
        "(b) bytes read per epoch / split's stored bytes",
        f"{'plan':>7} {'shards':>6} {'read GiB':>9} {'GETs':>7} {'ratio':>6} {'wall s':>7}",
    ]
    for x in r["reads"]:
        lines.append(
            f"{x['plan']:>7} {x['shards']:>6} {x['data_bytes'] / 2**30:>9.3f} "
            f"{x['data_requests']:>7} {x['ratio']:>6.3f} {x['seconds']:>7.1f}"
        )
    verdict = "met" if r["read_met"] else "MISSED"
    if r["quick"]:
        verdict += " (--quick: a few chunks per shard; the target is for the full size)"
    lines += [
        f"target <= {r['read_target']} with the blocks plan: {verdict}",
        "",
        f"(c) peak worker RSS, {m['attempts']} attempts of {m['shards']} shards, fresh process",
        f"  small set {m['small_peak_rss'] / 2**20:.0f} MiB, large set "
        f"{m['large_peak_rss'] / 2**20:.0f} MiB: {m['above'] / 1e9:+.3f} GB "
        f"(target <= {r['memory_target'] / 1e9} GB: {'met' if r['memory_met'] else 'MISSED'})",
    ]
    return "\n".join(lines)


def summary(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "benchmark": "scale_data",
        "split_gib": round(r["large"]["decoded_bytes"] / 2**30, 3),
        "read_ratio": {f"{x['plan']}/{x['shards']}": round(x["ratio"], 4) for x in r["reads"]},
        "read_met": r["read_met"],
        "memory_above_gb": round(r["memory"]["above"] / 1e9, 4),
        "memory_met": r["memory_met"],
        "quick": r["quick"],
    }


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        worker_main(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(p, quick_help="MBs instead of GBs (CI)", repeats=False)
    p.add_argument("--gib", type=float, default=2.0, help="size of the large set (GiB)")
    p.add_argument("--small-mb", type=float, default=20.0, help="size of the small set (MiB)")
    p.add_argument("--rows-plan", action="store_true", help="also the row plan, first count")
    p.add_argument("--dir", type=Path, default=None, help="scratch directory (default: temp)")
    args = p.parse_args()
    nbytes = int(args.gib * 2**30) if not args.quick else 24 << 20
    small = int(args.small_mb * 2**20) if not args.quick else 2 << 20
    scratch = Path(tempfile.mkdtemp(prefix="vcdl-scale-data-", dir=args.dir))
    try:
        r = measure(
            scratch,
            nbytes=nbytes,
            small_bytes=small,
            features=1000 if not args.quick else 250,
            shard_counts=(8, 32) if not args.quick else (2, 4),
            cache_mb=1,
            rows_plan=args.rows_plan or args.quick,
            quick=args.quick,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the GBs go, whatever happened
    with human_output(args):
        print(report(r))
    emit_summary("scale_data", summary(r), args)


if __name__ == "__main__":
    main()
