"""What overlapping the network with training buys a worker on a slow link (issue 50 item 6).

One real run per link profile and setting: the train flow, a LocalCluster
of one worker with one training slot (and its spare Dask thread), the
averaging rule (every shard of an epoch trains from the epoch's pinned
base), a sleeper model (``vcdl.models.synthetic``: ``--params`` float32
weights, training a sleep of ``--attempt-seconds``), the store on S3 (moto)
reached through the fleet harness's userspace proxy with ``--rtt`` ms of
round trip (latency only: bandwidth is not shaped without the namespaced
fleet's tbf), the ledger an SQLite file. Each profile runs with
``VCDL_NETWORK_OVERLAP=0`` (every attempt reads its base and writes its
result in turn) and with the overlaps (:mod:`vcdl.worker.basecache`: the
pinned base read in the background and kept, the slot handed on while the
result is written).

Reported per run: utilization (Σ training seconds of merged attempts ÷ the
slot's wall, first claim to last merge), the mean seconds of an attempt
from its claim to its record, and the mean ``net_wait`` (seconds the
attempt's thread waited on the store), ``read`` and ``write``.

    python -m benchmarks.netoverlap --rtt 0 40 100 --params 4e6 --attempt-seconds 1
    python -m benchmarks.netoverlap --quick      # one 40-ms profile, small
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from benchmarks.harness import add_common_options, emit_summary
from benchmarks.netfleet import LinkProfile
from benchmarks.netfleet.proxy import DRIVER, LinkProxy
from benchmarks.sleeper import sleeper_config

KEY, SECRET = "testing", "testing"


def _bucket(endpoint: str) -> str:
    import boto3  # a moto dependency

    name = f"netoverlap-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET
    ).create_bucket(Bucket=name)
    return name


def one_run(
    args: argparse.Namespace, endpoint: str, bucket: str, rtt: float, overlap: bool, home: Path
) -> dict[str, Any]:
    """One run over the proxied store; its figures from the ledger."""
    from vcdl import api
    from vcdl.config import parse_config
    from vcdl.data import write_arrays
    from vcdl.ledger import attempt_timings
    from vcdl.runtime import RunRef, open_ledger
    from vcdl.worker.basecache import OVERLAP_ENV

    os.environ[OVERLAP_ENV] = "1" if overlap else "0"  # the worker processes inherit it
    name = f"overlap-{int(rtt)}-{int(overlap)}"
    raw = sleeper_config(name, args.epochs, args.shards, args.params, args.attempt_seconds)
    raw["merge"] = {"rule": "average"}
    raw["cluster"] = {"workers": 1, "threads_per_worker": 1}
    raw["ledger"] = {"url": f"sqlite:///{home / name}.db"}
    raw["store"] = {"url": f"s3://{bucket}/{name}", "storage_options": {"endpoint_url": endpoint}}
    cfg = parse_config(raw).with_locations(home)
    ref = RunRef.from_config(cfg)
    import numpy as np

    write_arrays(
        ref.store(),
        cfg.data.name,
        {
            "train": {"x": np.zeros((cfg.data.shards, 1), np.float32)},
            "test": {"x": np.zeros((1, 1), np.float32)},
        },
        source="benchmarks/netoverlap.py: one row per shard",
    )
    summary = api.train(cfg, home=home)
    if summary["state"] != "completed":
        raise RuntimeError(f"run {name} ended {summary['state']}")
    assert cfg.ledger.url is not None
    ledger = open_ledger(cfg.ledger.url)
    merged = [a for a in ledger.attempts(name) if a.state == "merged"]
    versions = [v for v in ledger.versions(name) if v.subtask_id is not None]
    first = min(a.started_at.timestamp() for a in merged)
    last = max(v.created_at.timestamp() for v in versions)
    wall = last - first
    train_s = sum(a.train_seconds or 0.0 for a in merged)
    timings = [attempt_timings(a) for a in merged]

    def mean(key: str) -> float:
        return round(statistics.mean(t.get(key, 0.0) for t in timings), 3)

    spans = [
        (a.finished_at.timestamp() - a.started_at.timestamp())
        for a in merged
        if a.finished_at is not None
    ]
    return {
        "rtt_ms": rtt,
        "overlap": overlap,
        "merged": len(merged),
        "utilization": round(train_s / wall, 4),
        "wall_s": round(wall, 2),
        "attempt_s": round(statistics.mean(spans), 3),
        "net_wait_s": mean("net_wait"),
        "read_s": mean("read"),
        "write_s": mean("write"),
        "base_reads": sum(1 for t in timings if "base_read" in t) if overlap else len(timings),
        "per_attempt": [
            {"epoch": a.epoch, "shard": a.shard, **{k: round(v, 3) for k, v in t.items()}}
            for a, t in zip(merged, timings, strict=True)
        ],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rtt", type=float, nargs="+", default=[0.0, 40.0, 100.0])
    p.add_argument("--params", type=float, default=4e6)
    p.add_argument("--attempt-seconds", type=float, default=1.0)
    p.add_argument("--shards", type=int, default=6)
    p.add_argument("--epochs", type=int, default=2)
    add_common_options(p, quick_help="one 40-ms profile, 1M parameters", repeats=False)
    args = p.parse_args(argv)
    table = sys.stderr if args.json else sys.stdout
    if args.quick:
        args.rtt, args.params, args.shards, args.epochs = [40.0], 1e6, 3, 1

    from moto.server import ThreadedMotoServer

    # The sleeper model is code the run imports: allowed, as benchmarks/fleet.py does.
    allowed = [p for p in os.environ.get("VCDL_ALLOW_IMPORTS", "").split(",") if p.strip()]
    os.environ["VCDL_ALLOW_IMPORTS"] = ",".join([*allowed, "vcdl.models.synthetic"])
    os.environ.setdefault("AWS_ACCESS_KEY_ID", KEY)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", SECRET)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    proxy = LinkProxy(lambda _peer: DRIVER)
    rows = []
    # One home for every run: the process's Prefect server keeps its database in the
    # first run's home, so a home removed after its run would take it away mid-benchmark.
    home = Path(tempfile.mkdtemp(prefix="vcdl-netoverlap-"))
    try:
        moto_host, moto_port = server.get_host_and_port()
        endpoint = f"http://{moto_host}:{moto_port}"
        target = urlsplit(endpoint)
        host, port = proxy.add_route("s3", "127.0.0.1", (target.hostname or "", target.port or 0))
        proxied = f"http://{host}:{port}"
        for rtt in args.rtt:
            proxy.set_profile(DRIVER, LinkProfile(latency_ms=rtt))
            for overlap in (False, True):
                t = time.monotonic()
                row = one_run(args, proxied, _bucket(endpoint), rtt, overlap, home)
                row["run_s"] = round(time.monotonic() - t, 1)
                rows.append(row)
                print(
                    f"rtt {rtt:5.0f} ms overlap {'on ' if overlap else 'off'}: utilization "
                    f"{100 * row['utilization']:5.1f} %, attempt {row['attempt_s']:.2f} s, "
                    f"net_wait {row['net_wait_s']:.3f} s (read {row['read_s']:.3f}, write "
                    f"{row['write_s']:.3f}), base reads {row['base_reads']}/{row['merged']}",
                    file=table,
                    flush=True,
                )
    finally:
        proxy.close()
        server.stop()
        shutil.rmtree(home, ignore_errors=True)
    emit_summary("netoverlap", {"runs": rows}, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
