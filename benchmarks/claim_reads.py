"""A worker's claim reads: the epoch's rows filtered in Python against its own rows' query.

Before it starts an attempt, a worker reads its subtask and the subtask's
earlier attempts (``vcdl.worker.attempt.run_attempt``). It used to read every
subtask and every attempt of the epoch and keep one shard's; it now asks the
ledger for that shard's rows (``Ledger.subtasks``/``attempts`` with
``shard=``). Both ways run here in one process, on one SQLite ledger of N
shards each attempted once (finished, with timings, as in a run), alternated,
and the CPU seconds per claim's reads are reported (CPU, not wall: the
machine is shared). Issue 52, item 4 (docs/attempt-costs.md).

    python -m benchmarks.claim_reads                   # N = 8 and 256, 100 claims, 3 repeats
    python -m benchmarks.claim_reads --shards 8 64 256 1024
    python -m benchmarks.claim_reads --quick           # CI: N = 8 and 64, 20 claims, 1 repeat
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchmarks.harness import add_common_options, emit_summary, human_output, median
from vcdl.ledger import Ledger


def filled_ledger(path: str, shards: int) -> Ledger:
    """A run of one epoch of ``shards`` subtasks, each attempted once and finished."""
    ledger = Ledger(f"sqlite:///{path}/ledger.db")
    ledger.create_run("r", "{}", "r/v0", "0" * 64)
    ledger.ensure_subtasks("r", 0, shards)
    timings = {"claim": 0.1, "read": 0.2, "train": 30.0, "write": 0.1}
    for k in range(shards):
        a = ledger.start_attempt("r", 0, k, f"w{k}")
        ledger.finish_attempt(
            a.id, state="finished", samples=10, train_seconds=30.0, timings=timings
        )
    return ledger


def ways(ledger: Ledger) -> dict[str, Callable[[int], tuple[Any, list[Any]]]]:
    """The claim's two reads, before and after."""

    def epoch_rows(k: int) -> tuple[Any, list[Any]]:
        sub = next((s for s in ledger.subtasks("r", 0) if s.shard == k), None)
        return sub, [a for a in ledger.attempts("r", 0) if a.shard == k]

    def own_rows(k: int) -> tuple[Any, list[Any]]:
        sub = next(iter(ledger.subtasks("r", 0, shard=k)), None)
        return sub, ledger.attempts("r", 0, shard=k)

    return {"epoch's rows (before)": epoch_rows, "own rows (after)": own_rows}


def bench(shards: int, claims: int, repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="vcdl-claim-reads-") as tmp:
        ledger = filled_ledger(tmp, shards)
        contenders = ways(ledger)
        for k in range(shards):  # the same rows either way
            got = [(s.id, [a.id for a in atts]) for s, atts in (f(k) for f in contenders.values())]
            assert got[0] == got[1], (k, got)
        runs: dict[str, list[float]] = {name: [] for name in contenders}
        for i in range(repeats):
            order = list(contenders.items())
            for name, f in order if i % 2 == 0 else order[::-1]:
                t = time.process_time()
                for c in range(claims):
                    f(c % shards)
                runs[name].append((time.process_time() - t) / claims * 1e3)
        ledger.close()
    ms = {name: round(median(v), 3) for name, v in runs.items()}
    before, after = ms.values()
    return {"shards": shards, "cpu_ms_per_claim": ms, "ratio": round(before / after, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", type=int, nargs="+", default=[8, 256])
    p.add_argument("--claims", type=int, default=100, help="claims per figure")
    add_common_options(p, quick_help="CI: N = 8 and 64, 20 claims, 1 repeat", repeats_default=3)
    args = p.parse_args()
    shards, claims, repeats = args.shards, args.claims, args.repeats
    if args.quick:
        shards, claims, repeats = [8, 64], 20, 1
    with human_output(args):
        results = []
        for n in shards:
            r = bench(n, claims, repeats)
            results.append(r)
            cells = ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_ms_per_claim"].items())
            print(f"N = {n} shards: CPU ms per claim's reads: {cells} ({r['ratio']:.1f}x)")
    emit_summary("claim_reads", {"results": results}, args)


if __name__ == "__main__":
    main()
