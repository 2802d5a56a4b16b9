"""What one scrape of the driver's metrics costs: the read of a run's rows, by run size.

A scrape reads the run's subtasks, attempts, versions and evaluations from
the ledger and computes the figures (vcdl.metrics.exporter.read_figures);
this times that, median of ``--repeats`` (5), on an SQLite ledger holding a synthetic run of
N attempts (one per subtask, merged, with a timing breakdown each, as a
fault-free run leaves them). No tensors, no Dask, no Prefect.

    python -m benchmarks.metrics_read                 # 1 000, 10 000 and 50 000 attempts
    python -m benchmarks.metrics_read --attempts 2000
    python -m benchmarks.metrics_read --quick         # 1 000 attempts, 3 reads
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from sqlmodel import Session

from benchmarks.harness import add_common_options, emit_summary, human_output, median
from vcdl.config import parse_config
from vcdl.ledger import Attempt, Ledger, Subtask, Version, utcnow
from vcdl.metrics.exporter import read_figures
from vcdl.runtime import RunRef
from vcdl.views.prices import run_prices

PHASES = {"claim": 0.03, "read": 0.01, "train": 4.2, "write": 0.02, "assimilator_merge": 0.05}


def build(url: str, attempts: int, shards: int) -> None:
    """A run of ``attempts`` merged attempts, ``shards`` per epoch."""
    ledger = Ledger(url)
    cfg = parse_config({"run": {"name": "r", "epochs": attempts // shards}})
    ledger.create_run("r", cfg.model_dump_json(), "v0", "c")
    t0 = utcnow()
    with Session(ledger._engine) as s:
        for i in range(attempts):
            epoch, shard = divmod(i, shards)
            s.add(Subtask(id=i + 1, run="r", epoch=epoch, shard=shard, state="merged", attempts=1))
        s.flush()
        for i in range(attempts):
            epoch, shard = divmod(i, shards)
            start = t0 + timedelta(seconds=i)
            s.add(
                Attempt(
                    id=f"a{i}", run="r", subtask_id=i + 1, epoch=epoch, shard=shard, number=1,
                    worker="tcp://10.0.0.1:4000", base_version=i, state="merged",
                    samples=100, loss=1.0, train_seconds=4.2, started_at=start,
                    finished_at=start + timedelta(seconds=5), timings=json.dumps(PHASES),
                )
            )  # fmt: skip
        s.flush()
        for i in range(attempts):
            s.add(
                Version(
                    run="r", number=i + 1, parent=i, subtask_id=i + 1, attempt_id=f"a{i}",
                    epoch=i // shards, alpha=0.5, staleness=i % 3, uri=f"v{i + 1}", checksum="c",
                )
            )  # fmt: skip
        s.commit()
    ledger.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--attempts", type=int, nargs="*", default=[1000, 10_000, 50_000])
    p.add_argument("--shards", type=int, default=100)
    add_common_options(
        p,
        quick_help="1 000 attempts, 3 reads (CI)",
        repeats_default=5,
        repeats_help="timed reads per size; the median is shown",
    )
    args = p.parse_args()
    attempts, repeats = ([1000], 3) if args.quick else (args.attempts, args.repeats)
    with human_output(args):
        print(f"| attempts | read + figures, median of {repeats} (s) |")
        print("|---:|---:|")
        seconds = {str(n): round(read_seconds(n, args.shards, repeats), 4) for n in attempts}
    emit_summary("metrics_read", {"repeats": repeats, "median_s": seconds}, args)


def read_seconds(n: int, shards: int, repeats: int) -> float:
    """The median seconds of ``repeats`` reads of a run of ``n`` attempts (prints its row)."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'ledger.db'}"
        build(url, n, shards)
        cfg = parse_config({"run": {"name": "r", "epochs": n // shards}})
        ref = RunRef(run="r", ledger_url=url, store_url=tmp)
        prices = run_prices(cfg.cost)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            figures = read_figures(ref, cfg, prices)
            times.append(time.perf_counter() - started)
        assert figures.merges == n and figures.attempts_started == n
        ref.ledger().close()
    seconds = median(times)
    print(f"| {n:,} | {seconds:.3f} |", flush=True)
    return seconds


if __name__ == "__main__":
    main()
