"""Merges of big models: throughput and the driver's memory, streamed against whole-state.

For a model of ``--params`` parameters (default 100M and 1B; float32 in
tensors of 4096 x 4096 with a bias and an int64 counter each, as in a
transformer's layers), writes a head and a result version to a local
store, then merges the result into the head in a fresh subprocess per
contender, measuring the merge pipeline (read the result, merge, write the
version) and the process's peak resident memory above its baseline (the
process after imports, before the head is read: what a driver holds without
a model):

* ``streamed`` -- what the assimilator does (``vcdl.driver.streamed``): the
  head in memory (the driver's HeadCache), the result read 64 MiB of tensors
  at a time (a larger tensor, such as ``--embedding-rows``', in rows) while
  earlier batches are merged into the spare buffers and written, the three
  stages overlapped;
* ``whole`` -- the assimilator before: ``read_state`` of the whole result,
  the rule's merge into the spare buffers, ``write_state``;
* ``serial`` and ``folded`` -- ``--fold`` results (k, default 4) merged in
  one process. In ``serial`` each merges into the previous one's output and
  writes its version, as the assimilator does one at a time; ``folded`` is
  what ``merge.fold`` does (``vcdl.driver.streamed.streamed_fold``): one pass,
  each batch of tensors through the k merges, only the last version written.
  (Before ``merge.fold`` was built, ``folded`` ran k streamed merges with the
  first k - 1 writing nowhere: the estimate in docs/results.md.)

* ``sharded`` -- ``streamed`` by 2 merger processes (``merge.mergers = 2``,
  ``vcdl.driver.sharded``): each merges and writes its range of the chunks;
* ``streamed-int8`` and ``sharded-int8`` -- the same two for an int8 result
  (``merge.result_precision = "int8_delta"``, decoded against its base, the
  head, in memory as the driver's cache holds it): where a merger is CPU-bound.

* ``limit``, ``limit-2``, ``limit-int8``, ``limit-int8-2``, ``limit-sha256`` --
  the machine's own limit for the same work, measured in the same run
  (:mod:`benchmarks.io_limit`: the same chunk files read with plain reads,
  blended with one torch kernel, written, three threads a pipeline, no
  fsync; ``-2``: two pipelines over halves of the chunks; ``-int8``: the int8
  result decoded; ``-sha256``: every chunk read and written hashed too, as
  the merge verifies and records its tensors). Each merge contender beside
  its limit is reported as a fraction of it: ``streamed`` of ``limit``,
  ``sharded`` of ``limit-2``, and the int8 pair of theirs (issue 52).

For ``streamed``, the seconds each stage was busy (read, merge, write; they
overlap) are printed too. With ``sharded`` beside ``streamed`` (and their
int8 pair), K = 2's merges per second are reported against K = 1's.

The spare buffers (the next head) are allocated and touched before the
clock starts, as the driver's cache holds them after its first merges.
Local files go through the page cache (no fsync). Rule ``vc_asgd``, no norm
bound (the defaults). Merging runs on one torch thread, as in the driver.

Targets (issue 33): the pipeline >= 1 GB/s of model bytes at 100M
parameters; peak memory <= baseline + 3x the model's bytes at 100M and 1B.

    python -m benchmarks.big_merge                   # 100M and 1B, 3 repeats
    python -m benchmarks.big_merge --quick           # 17M in 1024 x 1024 layers, 1 repeat
    python -m benchmarks.big_merge --params 1e8 --repeats 5
    python -m benchmarks.big_merge --params 2.5e7 1e8 --modes serial folded --fold 4
    python -m benchmarks.big_merge --params 1e8 --embedding-rows 8192 --modes streamed folded
    python -m benchmarks.big_merge --params 1e8 --modes streamed sharded streamed-int8 sharded-int8
    python -m benchmarks.big_merge --params 1e8 --modes streamed sharded streamed-int8 \
        sharded-int8 limit limit-2 limit-int8 limit-int8-2 limit-sha256     # issue 52
"""

from __future__ import annotations

import argparse
import functools
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

from benchmarks.harness import REPO, add_common_options, emit_summary, human_output, median
from benchmarks.io_limit_modes import LIMIT_OF, LIMITS, limit_args

SIDE = 4096
MODES = (
    "streamed",
    "whole",
    "serial",
    "folded",
    "sharded",
    "streamed-int8",
    "sharded-int8",
    *LIMITS,
)
QUICK = ("streamed", "whole", "serial", "folded", "sharded", "limit", "limit-2")
SHARDED = {"sharded": "streamed", "sharded-int8": "streamed-int8"}
"""Each K = 2 contender and its K = 1 twin."""
FOLDING = ("serial", "folded")
"""The contenders that merge ``--fold`` results; their seconds are per result."""


def layer_count(params: float, side: int) -> int:
    return max(1, round(params / (side * side + side)))


def write_states(
    store_dir: str, layers: int, side: int = SIDE, embedding: int = 0, int8: bool = False
) -> int:
    """Head and result groups of ``layers`` layers (after an ``embedding`` x ``side``
    token embedding if ``embedding``), written in parts (bounded memory); with ``int8``,
    the result as an int8 change too."""
    import torch

    from vcdl.store import WeightStore
    from vcdl.store.streaming import TensorSpec

    store = WeightStore(store_dir)
    specs = []
    if embedding:
        specs.append(TensorSpec("embed.weight", torch.float32, (embedding, side)))
    for i in range(layers):
        specs += [
            TensorSpec(f"layers.{i}.weight", torch.float32, (side, side)),
            TensorSpec(f"layers.{i}.bias", torch.float32, (side,)),
            TensorSpec(f"layers.{i}.steps", torch.int64, ()),
        ]
    gen = torch.Generator().manual_seed(0)
    for path, shift in (("head", 0.0), ("result", 0.01)):
        writer = store.writer(path, specs)
        if embedding:
            writer.write({"embed.weight": torch.randn(embedding, side, generator=gen) + shift})
        for i in range(layers):
            writer.write(
                {
                    f"layers.{i}.weight": torch.randn(side, side, generator=gen) + shift,
                    f"layers.{i}.bias": torch.randn(side, generator=gen),
                    f"layers.{i}.steps": torch.tensor(i),
                }
            )
        writer.commit()
    if int8:
        write_int8(store)
    return sum(s.nbytes for s in specs)


def write_int8(store: Any) -> None:
    """The result as an int8 change from the head (``int8_delta``), a tensor at a time."""
    import torch

    from vcdl.merge.codec import encode
    from vcdl.store.streaming import specs_of

    head, result = store.reader("head"), store.reader("result")
    specs = []
    for s in head.specs:  # the encoding's specs, from zeros of each tensor's shape
        zeros = {s.name: torch.zeros(s.shape, dtype=s.dtype)}
        specs += specs_of(encode(zeros, zeros, "int8_delta"))
    writer = store.writer("result-int8", specs)
    for s in head.specs:
        writer.write(encode(result.read([s.name]), head.read([s.name]), "int8_delta"))
    writer.commit()


def child(store_dir: str, mode: str, out: str, batch_mb: str, fold: str = "1") -> None:
    """One merge (``fold`` for serial/folded) in this fresh process; its figures as JSON."""
    import torch

    from vcdl.config import MergeSection
    from vcdl.driver.streamed import Decoded, Step, streamed_fold, streamed_merge
    from vcdl.merge.rules import merge_rule
    from vcdl.store import WeightStore
    from vcdl.store.streaming import specs_of

    torch.set_num_threads(1)
    if mode in LIMITS:
        _limit_child(store_dir, mode, out)
        return
    store = WeightStore(store_dir)
    rule = merge_rule(MergeSection(rule="vc_asgd"))
    baseline = _current_bytes()
    _reset_peak()
    head = store.read_state("head")  # what the driver's HeadCache holds
    # The spare buffers the driver's cache holds after its first merges.
    spare = {k: torch.empty_like(t) for k, t in head.items()}
    for t in spare.values():
        t.zero_()
        if mode.startswith("sharded"):  # as the driver's cache holds them after one merge
            t.share_memory_()
    stages: dict[str, float] = {}
    cpu0 = _cpu_seconds()
    start = time.perf_counter()
    if mode == "folded":
        k = int(fold)
        got = streamed_fold(
            rule,
            head,
            [Step(store.reader("result"), 0.5) for _ in range(k)],
            functools.partial(store.writer, "version", specs_of(head)),
            out=spare,
            batch_bytes=int(float(batch_mb) * (1 << 20)),
        )
        assert got.applied is not None, got.reason
    elif mode != "whole":
        # streamed is one merge (fold 1) that writes its version.
        k, specs = int(fold), specs_of(head)
        for i in range(k):
            source: Any = store.reader("result")
            if mode.endswith("-int8"):  # decoded against its base: the head, in memory
                source = Decoded(store.reader("result-int8"), head, "int8_delta")
            got = streamed_merge(
                rule,
                head,
                source,
                0.5,
                functools.partial(store.writer, f"version-{i}", specs),
                out=spare,
                batch_bytes=int(float(batch_mb) * (1 << 20)),
                mergers=2 if mode.startswith("sharded") else 1,
            )
            assert got.applied is not None, got.reason
            # The output is the next merge's head; the old head its buffers.
            head, spare = got.applied.weights, head
        if mode != "serial":
            stages = dict(got.timings or {})
    else:
        result = store.read_state("result")
        merged = rule.apply(head, result, 0.5, out=spare)
        assert not isinstance(merged, str), merged
        store.write_state("version", merged.weights)
        store.checksum("version")
        del result
    seconds = time.perf_counter() - start
    cpu = _cpu_seconds() - cpu0
    peak = _peak_bytes()
    Path(out).write_text(
        json.dumps(
            {"seconds": seconds, "cpu": cpu, "baseline": baseline, "peak": peak, "stages": stages}
        )
    )


def _limit_child(store_dir: str, mode: str, out: str) -> None:
    """The machine's own limit (:mod:`benchmarks.io_limit`) in this fresh process."""
    from benchmarks.io_limit import run_limit

    baseline = _current_bytes()
    _reset_peak()
    cpu0 = _cpu_seconds()
    got = run_limit(store_dir, out_name="version-limit", **limit_args(mode))
    cpu = _cpu_seconds() - cpu0
    Path(out).write_text(
        json.dumps(
            {
                "seconds": got["seconds"],
                "cpu": cpu,
                "baseline": baseline,
                "peak": _peak_bytes(),
                "stages": got["stages"],
            }
        )
    )


def _cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (the mergers): on a shared
    machine, a figure other processes' load inflates far less than wall time."""
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _current_bytes() -> int:
    """Resident memory now (the baseline: a high-water mark would include import transients)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> None:
    """Start the peak over from now (Linux: "5" to clear_refs resets VmHWM), so the
    transient memory of imports does not mask a merge's own peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # then the peak since the start of the process (an overestimate)


def _peak_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_child(store_dir: str, mode: str, tmp: str, batch_mb: float, fold: int) -> dict[str, Any]:
    out = os.path.join(tmp, f"{mode}.json")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.big_merge",
            "--child",
            store_dir,
            mode,
            out,
            str(batch_mb),
            str(fold),
        ],
        check=True,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    res: dict[str, Any] = json.loads(Path(out).read_text())
    for name in os.listdir(store_dir):
        if name.startswith("version"):
            shutil.rmtree(os.path.join(store_dir, name), ignore_errors=True)
    return res


def bench(
    params: float,
    repeats: int,
    modes: list[str],
    side: int,
    batch_mb: float,
    fold: int = 4,
    embedding: int = 0,
) -> dict[str, Any]:
    layers = layer_count(params - embedding * side, side)
    with tempfile.TemporaryDirectory(prefix="vcdl-big-merge-") as tmp:
        store_dir = os.path.join(tmp, "store")
        t = time.perf_counter()
        int8 = any("-int8" in m for m in modes)
        nbytes = write_states(store_dir, layers, side, embedding, int8)
        print(
            f"[{params:.0e}] wrote head and result: {nbytes / 1e9:.2f} GB each in "
            f"{time.perf_counter() - t:.1f} s",
            flush=True,
        )
        runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
        # Round-robin, the order reversed every other round: the contender that
        # runs later finds a warmer machine (measured: up to 15 % with identical
        # work), so no contender may always go first.
        for i in range(repeats):
            for mode in modes if i % 2 == 0 else modes[::-1]:
                per = fold if mode in FOLDING else 1
                r = run_child(store_dir, mode, tmp, batch_mb, per)
                r["seconds"] /= per
                r["cpu"] = r.get("cpu", 0.0) / per
                runs[mode].append(r)
                busy = ", ".join(f"{k} {v:.2f}" for k, v in r["stages"].items())
                print(
                    f"[{params:.0e}] {mode}: {r['seconds']:.2f} s"
                    + (f" a result ({per} merged)" if per > 1 else "")
                    + (f" (busy s: {busy})" if busy else "")
                    + f", peak {(r['peak'] - r['baseline']) / nbytes:.2f}x the model above "
                    "baseline",
                    flush=True,
                )
        rows = {mode: _row(mode, got, nbytes, fold) for mode, got in runs.items()}
    params_n = layers * (side * side + side) + embedding * side
    return {
        "params": params_n,
        "model_bytes": nbytes,
        "batch_mb": batch_mb,
        "embedding_rows": embedding,
        "rows": rows,
    }


def _row(mode: str, runs: list[dict[str, Any]], nbytes: int, fold: int) -> dict[str, Any]:
    """One contender's figures: medians of its runs, its highest peak."""
    seconds = median(r["seconds"] for r in runs)
    above = max(r["peak"] - r["baseline"] for r in runs)
    row: dict[str, Any] = {
        "seconds": round(seconds, 3),
        "cpu_seconds": round(median(r.get("cpu", 0.0) for r in runs), 3),
        "gb_per_s": round(nbytes / seconds / 1e9, 3),
        "peak_above_baseline_gb": round(above / 1e9, 3),
        "peak_over_model": round(above / nbytes, 2),
        "baseline_gb": round(runs[0]["baseline"] / 1e9, 3),
    }
    if mode in FOLDING:
        row["results_merged"] = fold
    if any(r["stages"] for r in runs):
        row["stage_busy_seconds"] = {
            k: round(median(r["stages"][k] for r in runs), 3) for k in runs[0]["stages"]
        }
    return row


def report(results: list[dict[str, Any]]) -> list[str]:
    """Print the table and the verdicts; return the verdicts (adds ``folded_saves``)."""
    print()
    head = ("params", "contender", "s", "GB/s", "peak - baseline", "x model")
    print("{:>8} {:13} {:>7} {:>6} {:>16} {:>8}".format(*head))
    verdicts = []
    for r in results:
        for mode, row in r["rows"].items():
            print(
                f"{r['params'] / 1e6:7.0f}M {mode:13} {row['seconds']:7.2f} {row['gb_per_s']:6.2f} "
                f"{row['peak_above_baseline_gb']:13.2f} GB {row['peak_over_model']:8.2f}"
            )
        s = r["rows"].get("streamed")
        # The targets are for 100M and 1B parameters; a model smaller than a
        # batch is read whole, so its memory says nothing about streaming.
        if s is not None and r["params"] >= 5e7:
            mem_ok = s["peak_over_model"] <= 3.0
            verdicts.append(
                f"{r['params'] / 1e6:.0f}M: memory {s['peak_over_model']:.2f}x <= 3x: "
                + ("met" if mem_ok else "MISSED")
            )
            if 5e7 <= r["params"] <= 2e8:
                verdicts.append(
                    f"{r['params'] / 1e6:.0f}M: pipeline {s['gb_per_s']:.2f} GB/s >= 1: "
                    + ("met" if s["gb_per_s"] >= 1.0 else "MISSED")
                )
        serial, folded = r["rows"].get("serial"), r["rows"].get("folded")
        if serial is not None and folded is not None:
            saved = 1 - folded["seconds"] / serial["seconds"]
            r["folded_saves"] = round(saved, 3)
            print(
                f"{r['params'] / 1e6:.0f}M: folding {serial['results_merged']} results with one "
                f"version write: {folded['seconds']:.2f} s a result against "
                f"{serial['seconds']:.2f} s ({saved:.0%} less)"
            )
        for mode, lim in LIMIT_OF.items():
            merge, limit = r["rows"].get(mode), r["rows"].get(lim)
            if merge is not None and limit is not None:
                share = limit["seconds"] / merge["seconds"]
                r.setdefault("of_limit", {})[mode] = round(share, 3)
                verdicts.append(
                    f"{r['params'] / 1e6:.0f}M {mode}: {merge['gb_per_s']:.2f} GB/s, "
                    f"{share:.0%} of the machine's {limit['gb_per_s']:.2f} ({lim}) >= 80 %: "
                    + ("met" if share >= 0.8 else "MISSED")
                )
        for k2, k1 in (*SHARDED.items(), ("limit-2", "limit"), ("limit-int8-2", "limit-int8")):
            two, one = r["rows"].get(k2), r["rows"].get(k1)
            if two is not None and one is not None:
                ratio = one["seconds"] / two["seconds"]
                r.setdefault("k2_over_k1", {})[k1] = round(ratio, 2)
                print(
                    f"{r['params'] / 1e6:.0f}M {k1}: K = 1 {1 / one['seconds']:.2f} merges/s, "
                    f"K = 2 {1 / two['seconds']:.2f} merges/s ({ratio:.2f}x); CPU s a merge "
                    f"{one['cpu_seconds']:.2f} and {two['cpu_seconds']:.2f}"
                )
    for v in verdicts:
        print(v)
    return verdicts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", type=float, nargs="+", default=[1e8, 1e9])
    p.add_argument("--modes", nargs="+", default=["streamed", "whole"])
    p.add_argument(
        "--whole-up-to",
        type=float,
        default=2e8,
        help="run the whole-state contender only up to this many parameters (its memory)",
    )
    p.add_argument("--batch-mb", type=float, default=64.0, help="streamed batch size")
    p.add_argument(
        "--fold", type=int, default=4, help="results merged by the serial and folded contenders"
    )
    p.add_argument(
        "--embedding-rows",
        type=int,
        default=0,
        help="a token embedding of this many rows x the layer side first (a language "
        "model's largest tensor; counted in --params)",
    )
    add_common_options(
        p,
        quick_help="CI: 17M parameters in 1024 x 1024 layers, 4-MB batches, 1 repeat, every "
        "full-precision contender (serial and folded with 2 results) and the limits "
        "limit and limit-2",
        repeats_default=3,
    )
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(*args.child)
        return
    params, repeats, side, batch_mb = args.params, args.repeats, SIDE, args.batch_mb
    fold, wanted = args.fold, args.modes
    if args.quick:
        params, repeats, side, batch_mb = [1.68e7], 1, 1024, 4.0
        fold, wanted = 2, list(QUICK)
    if fold < 1:
        p.error(f"--fold must be at least 1, got {fold}")
    unknown = sorted(set(wanted) - set(MODES))
    if unknown:
        p.error(f"unknown --modes {unknown}: choose from {', '.join(MODES)}")
    with human_output(args):
        results = []
        for n in params:
            modes = [m for m in wanted if m != "whole" or n <= args.whole_up_to]
            results.append(bench(n, repeats, modes, side, batch_mb, fold, args.embedding_rows))
        verdicts = report(results)
    emit_summary("big_merge", {"results": results, "verdicts": verdicts}, args)


if __name__ == "__main__":
    main()
