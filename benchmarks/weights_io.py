"""Weight I/O and merge throughput: a vcdl version beside torch.save/load and a flat blend.

On a ResNet-50-shaped state (25.6M parameters, 320 tensors, float32 plus
int64 BatchNorm counters; built here from the architecture's shapes, no
torchvision needed), measures:

* ``WeightStore.write_state`` + ``read_state(verify=True)`` (Zarr v3 format
  2: tensors packed per dtype in ~4 MiB chunks, a SHA-256 per tensor written
  and verified) beside ``torch.save`` + ``torch.load(weights_only=True)`` of
  the same tensors, on a local directory and on a loopback S3 endpoint (a
  moto server started in this process; torch.save/load go through
  ``s3fs.open``). The contenders alternate round by round, so both see the
  same load from other processes.
* the merge kernel, per result: ``HeadCache.merge``
  (``validated_vc_asgd``: the result's checks -- structure, NaN/Inf; no norm
  bound, the config default -- fused with a ``torch.lerp`` blend written into
  the recycled buffers of the version before the head), which the
  assimilator's streamed merge applies batch by batch, plus the
  ``HeadCache.put`` that follows the commit; in steady state (after two
  untimed merges the spare buffers exist). The whole pipeline (read,
  merge and write, overlapped) is ``benchmarks/big_merge.py``'s.
  Baselines: an in-memory alpha-blend of one flat float32
  tensor with as many elements, ``mul`` then in-place ``add_`` into a fresh
  output (a 98 MiB allocation page-faults) and into a preallocated one, and
  ``torch.lerp`` into a preallocated output; the target is judged against the
  fastest of the three. Also shown, without target: the separate
  ``validate_result`` + ``vc_asgd`` the assimilator did before (fresh output),
  ``vc_asgd`` (mul+add) into reused buffers, and the merge with a norm bound
  (which needs its own pass over ``result - head``). All with ``torch.set_num_threads(1)`` (the
  driver merges on one thread). GB/s is the bytes of one state merged per
  second.

Figures are medians of ``--repeats`` timed runs after untimed warm-up;
every group/file is written to a fresh path and deleted afterwards. Local
files go through the page cache (no fsync, for both contenders). Moto's S3 is
much slower per request than real S3: the S3 figures compare the two formats
on the same endpoint, not against AWS.

Targets (from the issue): version write+read <= 2x torch.save+load locally;
merge >= 50% of the alpha-blend throughput. Each is printed PASS or MISS.

    python -m benchmarks.weights_io              # ResNet-50 size, 5 repeats
    python -m benchmarks.weights_io --quick      # ~5M parameters, 2 repeats
    python -m benchmarks.weights_io --no-s3      # local only
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

from benchmarks.harness import add_common_options, emit_summary, human_output, median
from vcdl.config import MergeSection
from vcdl.driver.head_cache import HeadCache
from vcdl.merge import validate_result, vc_asgd
from vcdl.merge.rules import merge_rule
from vcdl.store import WeightStore
from vcdl.types import StateDict

TARGET_IO_RATIO = 2.0  # version write+read <= 2x torch.save+load (local)
TARGET_MERGE_RATIO = 0.5  # merge >= 50% of the flat alpha-blend


# --------------------------------------------------------------------------
# The state
# --------------------------------------------------------------------------


def resnet50_state(width: int = 64, classes: int = 1000, seed: int = 0) -> StateDict:
    """A state dict with ResNet-50's keys and shapes (torchvision's naming).

    ``width=64`` is ResNet-50 itself: 25,557,032 parameters, 320 tensors
    (161 parameters, 159 BatchNorm buffers). A smaller ``width`` keeps the
    320 tensors with narrower channels.
    """
    gen = torch.Generator().manual_seed(seed)
    state: StateDict = {}

    def conv(name: str, cout: int, cin: int, k: int) -> None:
        state[f"{name}.weight"] = torch.randn(cout, cin, k, k, generator=gen) * 0.05

    def bn(name: str, c: int) -> None:
        state[f"{name}.weight"] = torch.ones(c) + 0.01 * torch.randn(c, generator=gen)
        state[f"{name}.bias"] = 0.01 * torch.randn(c, generator=gen)
        state[f"{name}.running_mean"] = 0.01 * torch.randn(c, generator=gen)
        state[f"{name}.running_var"] = torch.ones(c)
        state[f"{name}.num_batches_tracked"] = torch.tensor(100, dtype=torch.int64)

    conv("conv1", width, 3, 7)
    bn("bn1", width)
    cin = width
    for stage, (blocks, mult) in enumerate(zip((3, 4, 6, 3), (1, 2, 4, 8), strict=True), 1):
        mid = width * mult
        out = mid * 4
        for b in range(blocks):
            p = f"layer{stage}.{b}"
            conv(f"{p}.conv1", mid, cin, 1)
            bn(f"{p}.bn1", mid)
            conv(f"{p}.conv2", mid, mid, 3)
            bn(f"{p}.bn2", mid)
            conv(f"{p}.conv3", out, mid, 1)
            bn(f"{p}.bn3", out)
            if b == 0:
                conv(f"{p}.downsample.0", out, cin, 1)
                bn(f"{p}.downsample.1", out)
            cin = out
    state["fc.weight"] = torch.randn(classes, cin, generator=gen) * 0.01
    state["fc.bias"] = torch.zeros(classes)
    return state


def parameter_count(state: StateDict) -> int:
    """Elements of the learnable tensors (BatchNorm running stats and counters excluded)."""
    return sum(
        t.numel()
        for k, t in state.items()
        if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))
    )


def nbytes(state: StateDict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


IOContender = tuple[Callable[[str], Any], Callable[[str], Any], Callable[[str], Any]]


def median_rounds(contenders: dict[str, IOContender], n: int) -> dict[str, tuple[float, float]]:
    """Median (write, read) seconds per contender over ``n`` fresh paths, after one warm-up.

    Each round runs every contender once (write, read, cleanup), so a burst
    of load from other processes hits all of them, not one.
    """
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    for i in range(n + 1):
        for name, (write, read, cleanup) in contenders.items():
            path = f"bench-{uuid.uuid4().hex[:8]}"
            w = timed(partial(write, path))
            r = timed(partial(read, path))
            cleanup(path)
            if i:  # the first round warms caches, connections and allocators
                times[name].append((w, r))
    return {
        name: (median(w for w, _ in ts), median(r for _, r in ts)) for name, ts in times.items()
    }


def check_round_trip(state: StateDict, got: StateDict) -> None:
    assert list(got) == list(state), "keys or order differ"
    for k, t in state.items():
        assert got[k].dtype == t.dtype and torch.equal(got[k], t), f"{k} differs"


# --------------------------------------------------------------------------
# Contenders
# --------------------------------------------------------------------------


def version_contender(store: WeightStore, state: StateDict) -> IOContender:
    """A vcdl version in ``store``, checked to round-trip exactly first."""
    check_round_trip(state, store.read_state(store.write_state("check", state)))
    store.delete("check")
    return (
        lambda p: store.write_state(p, state),
        lambda p: store.read_state(p, verify=True),
        store.delete,
    )


def figures(times: dict[str, tuple[float, float]]) -> dict[str, float]:
    (vw, vr), (tw, tr) = times["version"], times["torch"]
    return {"version_write": vw, "version_read": vr, "torch_save": tw, "torch_load": tr}


def bench_local(state: StateDict, n: int) -> dict[str, float]:
    root = tempfile.mkdtemp(prefix="vcdl-bench-io-")
    try:
        store = WeightStore(os.path.join(root, "store"))

        def file(p: str) -> str:
            return os.path.join(root, f"{p}.pt")

        times = median_rounds(
            {
                "version": version_contender(store, state),
                "torch": (
                    lambda p: torch.save(state, file(p)),
                    lambda p: torch.load(file(p), weights_only=True),
                    lambda p: os.remove(file(p)),
                ),
            },
            n,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return figures(times)


@contextmanager
def moto_s3() -> Iterator[tuple[str, dict[str, Any]]]:
    """A loopback S3 endpoint with one fresh bucket: (``s3://bucket``, storage options)."""
    import boto3
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        bucket = f"vcdl-bench-{uuid.uuid4().hex[:12]}"
        # No region_name: s3fs/boto3 would send a LocationConstraint moto rejects.
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        ).create_bucket(Bucket=bucket)
        yield f"s3://{bucket}", {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    finally:
        server.stop()


def bench_s3(state: StateDict, n: int) -> dict[str, float]:
    import s3fs

    with moto_s3() as (bucket_url, options):
        store = WeightStore(f"{bucket_url}/store", options)
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
        base = bucket_url.removeprefix("s3://")

        def save(p: str) -> None:
            with fs.open(f"{base}/{p}.pt", "wb") as f:
                torch.save(state, f)

        def load(p: str) -> StateDict:
            with fs.open(f"{base}/{p}.pt", "rb") as f:
                loaded: StateDict = torch.load(f, weights_only=True)
            return loaded

        save("check")
        check_round_trip(state, load("check"))
        fs.rm(f"{base}/check.pt")
        times = median_rounds(
            {
                "version": version_contender(store, state),
                "torch": (save, load, lambda p: fs.rm(f"{base}/{p}.pt")),
            },
            n,
        )
    return figures(times)


def bench_merge(state: StateDict, n: int) -> dict[str, float]:
    """Median seconds of the assimilator's per-merge work and of the baselines (1 thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = {k: (t + 0.01 if t.is_floating_point() else t + 1) for k, t in state.items()}
        elements = sum(t.numel() for t in state.values() if t.is_floating_point())
        gen = torch.Generator().manual_seed(1)
        flat_a = torch.randn(elements, generator=gen)
        flat_b = torch.randn(elements, generator=gen)
        alpha, beta = 0.7, 0.3
        out = torch.empty_like(flat_a)
        reused = {k: torch.empty_like(t) for k, t in state.items()}

        # The head chain lives in the cache, as in the driver: a copy of the
        # state, so recycling its buffers never touches ``state`` itself.
        cache = HeadCache()
        cache.put(0, {k: t.clone() for k, t in state.items()}, owned=True)

        def assimilate(bound: float | None = None) -> None:
            # What merge_attempt times as "merge" (checks fused with the blend),
            # plus the cache bookkeeping it does after the ledger commit.
            head = cache.state
            assert head is not None and cache.number is not None
            rule = merge_rule(MergeSection(rule="vc_asgd", max_update_norm=bound))
            new = cache.merge(rule, head, result, alpha)
            assert not isinstance(new, str), new
            cache.put(cache.number + 1, new.weights, owned=True)

        def before() -> None:
            # The assimilator's merge phase before this change.
            assert validate_result(state, result, None) is None
            vc_asgd(state, result, alpha)

        contenders: dict[str, Callable[[], Any]] = {
            "merge": assimilate,
            # A fresh 98 MiB output (page faults included), as a merge used to allocate...
            "blend": lambda: torch.mul(flat_a, alpha).add_(flat_b, alpha=beta),
            # ...and into a preallocated buffer, with the same two ops and with lerp.
            "blend_prealloc": lambda: torch.mul(flat_a, alpha, out=out).add_(flat_b, alpha=beta),
            "lerp_prealloc": lambda: torch.lerp(flat_a, flat_b, beta, out=out),
            # Variants and parts, no target.
            "before": before,
            "vc_asgd_out": lambda: vc_asgd(state, result, alpha, out=reused),
            "merge_bound": lambda: assimilate(1e9),
        }
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for i in range(n + 2):
            # Interleaved, so all see the same noise from other processes.
            for name, fn in contenders.items():
                t = timed(fn)
                if i >= 2:  # two warm-ups: after them the cache has its spare buffers
                    times[name].append(t)
        return {name: median(ts) for name, ts in times.items()}
    finally:
        torch.set_num_threads(threads)


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(
        p,
        quick_help="~5M-parameter state, 2 repeats",
        repeats_help="timed runs per figure (default 5; --quick 2)",
    )
    p.add_argument("--no-s3", action="store_true", help="skip the loopback S3 endpoint")
    args = p.parse_args()
    with human_output(args):
        summary = measure(args)
    emit_summary("weights_io", summary, args)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure, printed as tables with the targets' verdicts; the summary."""
    n = args.repeats or (2 if args.quick else 5)
    state = resnet50_state(width=28 if args.quick else 64)
    size = nbytes(state)
    gb = size / 1e9
    print(
        f"state: {parameter_count(state):,} parameters, {len(state)} tensors, "
        f"{size / 2**20:.1f} MiB; medians of {n} runs; {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} at start",
        flush=True,
    )
    local = bench_local(state, n)
    print(f"local done: {json.dumps({k: round(v, 3) for k, v in local.items()})}", flush=True)
    s3 = None if args.no_s3 else bench_s3(state, n)
    if s3:
        print(f"s3 done: {json.dumps({k: round(v, 3) for k, v in s3.items()})}", flush=True)
    merge = bench_merge(state, max(n, 5))

    rows = [("local", local)] + ([("s3 (moto)", s3)] if s3 else [])
    print()
    print(
        f"{'where':<10} {'contender':<28} {'write s':>8} {'read s':>8} {'total s':>8} {'ratio':>6}"
    )
    ratios: dict[str, float] = {}
    for where, fig in rows:
        version = fig["version_write"] + fig["version_read"]
        torch_io = fig["torch_save"] + fig["torch_load"]
        ratio = version / torch_io
        ratios[where] = ratio
        print(
            f"{where:<10} {'vcdl version (verify=True)':<28} {fig['version_write']:>8.3f} "
            f"{fig['version_read']:>8.3f} {version:>8.3f} {ratio:>6.2f}"
        )
        print(
            f"{'':<10} {'torch.save / torch.load':<28} {fig['torch_save']:>8.3f} "
            f"{fig['torch_load']:>8.3f} {torch_io:>8.3f} {1.0:>6.2f}"
        )
    gbs = {name: gb / seconds for name, seconds in merge.items()}
    baselines = ("blend", "blend_prealloc", "lerp_prealloc")
    fastest = max(baselines, key=lambda name: gbs[name])
    # The target is judged against the fastest of the blends.
    merge_ratio = gbs["merge"] / gbs[fastest]
    print()
    print(f"{'merge (1 thread)':<58} {'seconds':>8} {'GB/s':>8}")
    rows_merge = [
        ("merge", f"assimilator per merge ({len(state)} tensors), checks fused"),
        ("blend", "torch mul+add_, one flat tensor, fresh output"),
        ("blend_prealloc", "  same, into a preallocated output"),
        ("lerp_prealloc", "  torch.lerp into a preallocated output"),
        ("before", "(before) validate_result + vc_asgd, fresh output"),
        ("vc_asgd_out", "(part) vc_asgd, mul+add into reused buffers"),
        ("merge_bound", "(variant) assimilator merge with a norm bound"),
    ]
    for name, label in rows_merge:
        print(f"{label:<58} {merge[name]:>8.4f} {gbs[name]:>8.2f}")
    print()
    io_ok = ratios["local"] <= TARGET_IO_RATIO
    merge_ok = merge_ratio >= TARGET_MERGE_RATIO
    print(
        f"target: version write+read <= {TARGET_IO_RATIO:g}x torch.save+load locally: "
        f"{ratios['local']:.2f}x -> {verdict(io_ok)}"
    )
    print(
        f"target: merge >= {TARGET_MERGE_RATIO:.0%} of the fastest alpha-blend ({fastest}): "
        f"{merge_ratio:.0%} -> {verdict(merge_ok)}"
    )
    if s3:
        print(
            f"(no target) on moto S3: version write+read {ratios['s3 (moto)']:.2f}x torch via s3fs"
        )
    return {
        "parameters": parameter_count(state),
        "tensors": len(state),
        "bytes": size,
        "repeats": n,
        "local": {k: round(v, 4) for k, v in local.items()},
        "s3": {k: round(v, 4) for k, v in s3.items()} if s3 else None,
        "merge_seconds": round(merge["merge"], 5),
        "blend_seconds": round(merge["blend"], 5),
        "merge_gb_per_s": round(gbs["merge"], 3),
        "blend_gb_per_s": round(gbs["blend"], 3),
        "blend_prealloc_seconds": round(merge["blend_prealloc"], 5),
        "blend_prealloc_gb_per_s": round(gbs["blend_prealloc"], 3),
        "lerp_prealloc_seconds": round(merge["lerp_prealloc"], 5),
        "lerp_prealloc_gb_per_s": round(gbs["lerp_prealloc"], 3),
        "merge_parts_seconds": {
            k: round(merge[k], 5) for k in ("before", "vc_asgd_out", "merge_bound")
        },
        "merge_baseline": fastest,
        "io_ratio_local": round(ratios["local"], 3),
        "io_ratio_s3": round(ratios["s3 (moto)"], 3) if s3 else None,
        "merge_to_blend": round(merge_ratio, 3),
        "target_io_local": verdict(io_ok),
        "target_merge": verdict(merge_ok),
        "load_average_end": round(os.getloadavg()[0], 1),
    }


if __name__ == "__main__":
    main()
