"""Ledger merge throughput: merges per second with N concurrent writer processes.

What is measured is the *ledger part* of a merge only: no tensors, no Zarr,
no training. One **merge** is one subtask's four ledger calls, made by one
writer process in this order:

    start_attempt -> finish_attempt -> head -> commit_merge

and, when another writer moved the head first (:class:`HeadConflict`),
commit_merge again onto the head that came with the error (:class:`HeadMoved`;
else head is read again) until the compare-and-swap wins. merges/s counts
successful commit_merge calls (one per subtask, checked afterwards); the
retries are part of the cost of the merge they belong to. Every writer is a
separate spawned process with its own :class:`Ledger` (engine and pool).

Two workloads, both printed (``--runs`` picks one):

* ``team`` (the headline, measured against the target): 16 writers on 16
  runs, each writer the one assimilator of its own run, all sharing one
  ledger. This is how vcdl loads a ledger: a run has exactly one assimilator
  (its driver holds the run's lease), so concurrent merges come from
  different runs — a team's drivers on one PostgreSQL ledger. No head
  contention; what is left is the ledger's capacity for independent merges.
* ``one-run`` (an artificial worst case, kept to watch the CAS path): all 16
  writers merge into the same run, so the one head is as contended as it
  can be. vcdl never does this (one assimilator per run), and a real merge
  spends seconds on tensors between ``head`` and ``commit_merge``, which
  would make conflicts far rarer still.

Opening the ledger (connecting, schema check) happens before a barrier and is
not timed. Each configuration is repeated 3 times on a fresh database; the
table shows medians (and every round). The runs are checked afterwards
(gap-free chain, every subtask merged once), so a fast wrong ledger cannot
pass. Columns: conflicts and SQL statements per merge; CPU milliseconds per
merge of the writer processes and of the postgres server processes on this
machine (anyone's), and the cores busy with anything else meanwhile: a
number much above 0 means a noisy machine, the figures are then low.

    python -m benchmarks.ledger                      # 16 writers, both workloads, both backends
    python -m benchmarks.ledger --quick              # 4 writers, 200 merges
    python -m benchmarks.ledger --backends postgresql --runs 16 --merges 800
    python -m benchmarks.ledger --backends postgresql --pg-async-commit   # opt-in, see below

PostgreSQL: ``--pg-url`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``,
or ``$VCDL_BENCH_PG_URL``; ledger pool parameters may go in its query); each
repetition uses a fresh schema, dropped afterwards. ``--pg-async-commit``
sets ``synchronous_commit=off`` for the writers' sessions (the ledger's
documented opt-in, :mod:`vcdl.ledger.engine`): a server crash may then lose
the last fraction of a second of acknowledged merges, so its figures are
labelled ``async-commit`` and never count for the target.

The issue's target: >= 500 merges/s on PostgreSQL with 16 writers, on the
``team`` workload with durable commits; the last line says PASS or MISS.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import make_url

from benchmarks.harness import add_common_options, emit_summary, human_output, median
from vcdl.errors import HeadConflict
from vcdl.ledger import Ledger

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
OPS = ("start", "finish", "head", "commit")
TARGET_MERGES_PER_S = 500.0
TARGET_WRITERS = 16


def _share(index: int, writers: int, runs: int, merges: int) -> tuple[str, range]:
    """Writer ``index``'s run and its shards: writers take turns at their run's subtasks."""
    run = index % runs
    peers = len(range(run, writers, runs))
    return f"bench-{run}", range(index // runs, merges // runs, peers)


def _count_psycopg_statements(count: Any) -> None:
    """Also count statements run on psycopg directly (vcdl.ledger.pg's fast path).

    SQLAlchemy executes through cursors, this counts Connection.execute, so
    no statement is counted twice.
    """
    try:
        import psycopg
    except ImportError:
        return
    execute = psycopg.Connection.execute

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        count()
        return execute(self, *args, **kwargs)

    psycopg.Connection.execute = counted  # type: ignore[method-assign]


def _writer(
    url: str, index: int, writers: int, runs: int, merges: int, barrier: Any, out: Any
) -> None:
    """One writer process: merges its share of its run's subtasks (epoch 0)."""
    try:
        statements = Counter[str]()

        def count(*_args: Any) -> None:
            statements["sql"] += 1

        event.listen(Engine, "before_cursor_execute", count)
        _count_psycopg_statements(count)
        seconds: dict[str, float] = defaultdict(float)
        stats = Counter[str]()
        with Ledger(url) as ledger:
            run, shards = _share(index, writers, runs, merges)
            ledger.get_run(run)  # connect before the clock starts
            barrier.wait(timeout=120)
            statements.clear()
            cpu = time.process_time()
            start = time.perf_counter()
            for shard in shards:
                t0 = time.perf_counter()
                attempt = ledger.start_attempt(run, 0, shard, f"w{index}")
                t1 = time.perf_counter()
                ledger.finish_attempt(attempt.id, state="finished", result_uri=f"r/{attempt.id}")
                t2 = time.perf_counter()
                seconds["start"] += t1 - t0
                seconds["finish"] += t2 - t1
                head: int | None = None
                while True:
                    t0 = time.perf_counter()
                    if head is None:
                        head = ledger.head(run).number
                        stats["heads"] += 1
                    t1 = time.perf_counter()
                    try:
                        ledger.commit_merge(
                            run,
                            attempt.id,
                            expected_head=head,
                            uri=f"v/{head + 1}-{attempt.id[:8]}",
                            checksum=attempt.id,
                            alpha=0.5,
                            staleness=head - attempt.base_version,
                        )
                    except HeadConflict as exc:
                        stats["conflicts"] += 1
                        # The head that won comes with the error (HeadMoved), as
                        # the assimilator could use it; else read it again. (No
                        # isinstance: this also runs against an older vcdl.)
                        moved = getattr(exc, "head", None)
                        head = None if moved is None else moved.number
                        continue
                    else:
                        stats["merged"] += 1
                        break
                    finally:
                        t2 = time.perf_counter()
                        seconds["head"] += t1 - t0
                        seconds["commit"] += t2 - t1
            end = time.perf_counter()
            seconds["cpu"] = time.process_time() - cpu
        out.put(("ok", index, dict(stats), dict(seconds), statements["sql"], start, end))
    except BaseException:
        out.put(("error", index, traceback.format_exc(), {}, 0, 0.0, 0.0))


def _check(url: str, runs: int, merges: int) -> None:
    with Ledger(url) as ledger:
        for run in (f"bench-{r}" for r in range(runs)):
            versions = ledger.versions(run)
            n = merges // runs
            assert [v.number for v in versions] == list(range(n + 1)), "gap in the chain"
            assert [v.parent for v in versions] == [None, *range(n)], "wrong parents"
            assert ledger.head(run).number == n
            assert len({v.subtask_id for v in versions[1:]}) == n, "a subtask merged twice"


def _cpu_seconds() -> tuple[float, float]:
    """(CPU seconds used by local postgres processes, by the whole machine) so far.

    From /proc, so Linux and a local server only; zeros elsewhere.
    """
    tick = os.sysconf("SC_CLK_TCK")
    postgres = 0
    try:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
            if name.startswith("postgres"):
                # utime, stime, and those of reaped children (the postmaster's
                # ended backends)
                postgres += sum(int(x) for x in rest.split()[11:15])
        with open("/proc/stat") as f:
            total = f.readline().split()[1:]
        busy = sum(int(x) for i, x in enumerate(total) if i not in (3, 4))  # not idle, iowait
    except OSError:
        return 0.0, 0.0
    return postgres / tick, busy / tick


def run_once(url: str, writers: int, runs: int, merges: int) -> dict[str, Any]:
    """One timed contention round on a fresh ledger at ``url``."""
    with Ledger(url) as ledger:
        for r in range(runs):
            ledger.create_run(f"bench-{r}", "{}", "v/0", "sum0")
            ledger.ensure_subtasks(f"bench-{r}", 0, merges // runs)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(writers + 1)  # the writers and this process
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_writer, args=(url, i, writers, runs, merges, barrier, out), daemon=True)
        for i in range(writers)
    ]
    for proc in procs:
        proc.start()
    try:
        barrier.wait(timeout=120)
        cpu_before = _cpu_seconds()
        reports = [out.get(timeout=600) for _ in procs]
        cpu_after = _cpu_seconds()
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    errors = [r[2] for r in reports if r[0] == "error"]
    if errors:
        raise RuntimeError("a writer failed:\n" + "\n".join(errors))
    _check(url, runs, merges)
    stats, seconds = Counter[str](), defaultdict[str, float](float)
    for r in reports:
        stats.update(r[2])
        for key, value in r[3].items():
            seconds[key] += value
    wall = max(r[6] for r in reports) - min(r[5] for r in reports)
    merged = stats["merged"]
    server_cpu, machine_cpu = (b - a for a, b in zip(cpu_before, cpu_after, strict=True))
    return {
        "merges_per_s": merged / wall,
        "wall_s": wall,
        "conflicts_per_merge": stats["conflicts"] / merged,
        "heads_per_merge": stats["heads"] / merged,
        "statements_per_merge": sum(r[4] for r in reports) / merged,
        # CPU per merge of the writer processes and of the postgres server
        # (every postgres process on this machine: other users' too), and the
        # cores busy with anything else meanwhile (a noisy machine shows here).
        "cpu_ms": {
            "writers": 1000 * seconds["cpu"] / merged,
            "server": 1000 * server_cpu / merged,
            "other_cores": max(0.0, machine_cpu - seconds["cpu"] - server_cpu) / wall,
        },
        # Mean latency of one call, as its caller saw it (contention included).
        "ms": {
            "start": 1000 * seconds["start"] / merged,
            "finish": 1000 * seconds["finish"] / merged,
            "head": 1000 * seconds["head"] / max(1, stats["heads"]),
            "commit": 1000 * seconds["commit"] / (merged + stats["conflicts"]),
        },
    }


@contextmanager
def sqlite_db() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="vcdl-bench-") as tmp:
        yield f"sqlite:///{Path(tmp) / 'ledger.db'}"


@contextmanager
def pg_schema(base_url: str, async_commit: bool = False) -> Iterator[str]:
    """A fresh schema on the server of ``base_url``, selected by search_path.

    ``async_commit``: the writers' sessions get ``synchronous_commit=off``.
    """
    import psycopg

    url = make_url(base_url).set(drivername="postgresql+psycopg")
    schema = f"vcdl_bench_{uuid.uuid4().hex[:12]}"
    # The admin connection: the server and credentials only (the query may hold
    # vcdl's pool parameters, which libpq would refuse).
    dsn = url.set(drivername="postgresql", query={}).render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            options = f"{url.query.get('options', '')} -csearch_path={schema}".strip()
            if async_commit:
                options += " -csynchronous_commit=off"
            yield url.update_query_dict({"options": options}).render_as_string(hide_password=False)
        finally:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def bench(
    backend: str,
    writers: int,
    runs: int,
    merges: int,
    repeats: int,
    pg_url: str,
    async_commit: bool = False,
) -> dict[str, Any]:
    """``repeats`` rounds on fresh databases; medians, and every round's merges/s."""
    rounds = []
    for _ in range(repeats):
        db = sqlite_db() if backend == "sqlite" else pg_schema(pg_url, async_commit)
        with db as url:
            rounds.append(run_once(url, writers, runs, merges))

    def med(get: Any) -> float:
        return median(get(r) for r in rounds)

    return {
        "backend": backend,
        "workload": _workload(runs, writers),
        "durability": "async-commit" if async_commit and backend == "postgresql" else "durable",
        "writers": writers,
        "runs": runs,
        "merges": merges,
        "repeats": repeats,
        "merges_per_s": med(lambda r: r["merges_per_s"]),
        "all_merges_per_s": [round(r["merges_per_s"], 1) for r in rounds],
        "conflicts_per_merge": med(lambda r: r["conflicts_per_merge"]),
        "statements_per_merge": med(lambda r: r["statements_per_merge"]),
        "cpu_ms_per_merge": {k: med(lambda r, k=k: r["cpu_ms"][k]) for k in rounds[0]["cpu_ms"]},
        "ms_per_call": {op: med(lambda r, op=op: r["ms"][op]) for op in OPS},
    }


def _workload(runs: int, writers: int) -> str:
    if runs == 1 and writers > 1:
        return "one-run"
    return "team" if runs == writers else f"{runs}-runs"


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 2)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_options(
        p,
        quick_help="4 writers, 200 merges",
        repeats_default=3,
        repeats_help="repetitions; medians are shown",
    )
    p.add_argument("--writers", type=int, help="concurrent writer processes (default 16)")
    p.add_argument("--merges", type=int, help="merges per repetition (default 1600)")
    p.add_argument(
        "--runs",
        type=int,
        help="runs the writers share out (default: both workloads, one run per writer "
        "(team) and one run for all (one-run))",
    )
    p.add_argument("--backends", default="sqlite,postgresql", help="comma-separated")
    p.add_argument("--pg-url", default=os.environ.get("VCDL_BENCH_PG_URL", DEFAULT_PG_URL))
    p.add_argument(
        "--pg-async-commit",
        action="store_true",
        help="PostgreSQL with synchronous_commit=off (opt-in, may lose acknowledged "
        "merges on a server crash; reported apart, never against the target)",
    )
    args = p.parse_args()
    writers = args.writers or (4 if args.quick else 16)
    merges = args.merges or (200 if args.quick else 1600)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    workloads = [args.runs] if args.runs else [writers, 1]
    with human_output(args):
        summary = run_all(args, writers, merges, backends, workloads)
    emit_summary("ledger_merges", summary, args)


def run_all(
    args: argparse.Namespace, writers: int, merges: int, backends: list[str], workloads: list[int]
) -> dict[str, Any]:
    """Every backend and workload, their table and the target's verdict; the summary."""
    print(
        f"{'backend':<11} {'workload':<8} {'writers':>7} {'runs':>4} {'merges':>6} "
        f"{'merges/s':>8} {'confl/m':>7} {'stmts/m':>7} | CPU ms/merge: writers server, "
        "other load (cores) | ms/call: start finish head commit | merges/s per round"
    )
    results = []
    for backend in backends:
        for runs in workloads:
            async_commit = args.pg_async_commit and backend == "postgresql"
            r = bench(
                backend,
                writers,
                runs,
                merges - merges % runs,
                args.repeats,
                args.pg_url,
                async_commit,
            )
            results.append(r)
            cpu, ms = r["cpu_ms_per_merge"], r["ms_per_call"]
            label = r["workload"] + (" (async-commit)" if async_commit else "")
            print(
                f"{backend:<11} {label:<8} {writers:>7} {runs:>4} {r['merges']:>6} "
                f"{r['merges_per_s']:>8.0f} {r['conflicts_per_merge']:>7.2f} "
                f"{r['statements_per_merge']:>7.1f} | "
                f"{cpu['writers']:>20.2f} {cpu['server']:>6.2f} {cpu['other_cores']:>5.2f} | "
                f"{ms['start']:>14.2f} {ms['finish']:>6.2f} {ms['head']:>4.2f} "
                f"{ms['commit']:>6.2f} | " + ", ".join(f"{x:.0f}" for x in r["all_merges_per_s"]),
                flush=True,
            )
    summary: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "merge": "start_attempt + finish_attempt + head + commit_merge (+ CAS retries)",
        "results": {
            f"{r['backend']}/{r['workload']}/{r['durability']}": _rounded(r) for r in results
        },
    }
    headline = [
        r
        for r in results
        if r["backend"] == "postgresql"
        and r["workload"] == "team"
        and r["writers"] == TARGET_WRITERS
        and r["durability"] == "durable"
    ]
    if headline:
        rate = headline[0]["merges_per_s"]
        verdict = "PASS" if rate >= TARGET_MERGES_PER_S else "MISS"
        summary["target"] = {"merges_per_s": TARGET_MERGES_PER_S, "verdict": verdict}
        print(
            f"target: >= {TARGET_MERGES_PER_S:.0f} merges/s, PostgreSQL, {TARGET_WRITERS} "
            f"writers, team workload (one run per writer), durable commits: "
            f"{rate:.0f} merges/s -> {verdict}"
        )
    else:
        print(
            "target: not measured (needs --backends postgresql, 16 writers, the team "
            "workload, without --pg-async-commit)"
        )
    return summary


if __name__ == "__main__":
    main()
