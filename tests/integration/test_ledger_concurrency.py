"""At-most-once merging and the head CAS under real multi-process contention.

Spawned processes share one ledger (an SQLite file, then PostgreSQL). Each
makes an attempt at every subtask of the run(s) in its own random order, so
every subtask gets one attempt per process, and then merges each attempt the
way the assimilator does: read the head, ``commit_merge(expected_head=head)``,
retry on :class:`HeadConflict`, stop on :class:`AlreadyMerged`. Afterwards the
ledger must show every subtask merged exactly once, a gap-free version chain
and the losing attempts recorded as duplicates.

Four processes on three runs, on SQLite and PostgreSQL (read committed and
serializable), re-read the head after a conflict; the acceptance test, 16
processes on one PostgreSQL run, merges onto the head the conflict carries
(:class:`HeadMoved`). The merge throughput is printed (``merges/s``, with
``-s`` or not) and recorded as a JUnit property; it includes the attempt
bookkeeping around each merge and the duplicates' attempts.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import random
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from vcdl.errors import AlreadyMerged, HeadConflict
from vcdl.ledger import HeadMoved, Ledger

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120), pytest.mark.alone]


@dataclass(frozen=True)
class Plan:
    """Who contends for what (picklable: it travels to spawned processes)."""

    processes: int = 4
    epochs: int = 2
    shards: int = 8
    # Several runs, one after the other, so the timed phase is long enough to
    # measure (one 16-subtask run takes a few tens of milliseconds on SQLite).
    runs: tuple[str, ...] = tuple(f"conc-{i}" for i in range(3))
    # Merge onto the head a HeadMoved carries instead of reading it again.
    use_moved_head: bool = False

    @property
    def subtasks(self) -> int:
        return self.epochs * self.shards


def _worker(url: str, plan: Plan, seed: int, barrier: Any, results: Any) -> None:
    """One contending process (spawned: module-level, arguments picklable)."""
    try:
        rng = random.Random(seed)
        worker = f"proc-{seed}"
        stats = Counter[str]()
        with Ledger(url) as ledger:
            for run in plan.runs:
                for epoch in range(plan.epochs):
                    # Every process does it: ensure_subtasks must be idempotent
                    # under concurrency too.
                    ledger.ensure_subtasks(run, epoch, plan.shards)
            barrier.wait(timeout=60)
            start = time.monotonic()
            for run in plan.runs:
                order = [(e, k) for e in range(plan.epochs) for k in range(plan.shards)]
                rng.shuffle(order)
                for epoch, shard in order:
                    attempt = ledger.start_attempt(run, epoch, shard, worker)
                    ledger.finish_attempt(
                        attempt.id, state="finished", result_uri=f"{run}/r/{attempt.id}"
                    )
                    head: int | None = None
                    while True:
                        if head is None:
                            head = ledger.head(run).number
                            stats["heads"] += 1
                        try:
                            ledger.commit_merge(
                                run,
                                attempt.id,
                                expected_head=head,
                                uri=f"{run}/v/{head + 1}-{attempt.id[:8]}",
                                checksum=attempt.id,
                                alpha=0.5,
                                staleness=head - attempt.base_version,
                            )
                        except HeadConflict as exc:
                            stats["conflicts"] += 1
                            if plan.use_moved_head and isinstance(exc, HeadMoved):
                                head = exc.head.number  # no need to read it again
                            else:
                                head = None
                            continue
                        except AlreadyMerged:
                            stats["duplicates"] += 1
                        else:
                            stats["merged"] += 1
                        break
            end = time.monotonic()
        results.put(("ok", seed, dict(stats), start, end))
    except BaseException:
        results.put(("error", seed, traceback.format_exc(), 0.0, 0.0))


def _contend(
    url: str,
    label: str,
    capsys: pytest.CaptureFixture[str],
    plan: Plan,
    record_property: Callable[[str, object], None] | None = None,
) -> float:
    """Run the contention of ``plan`` on ``url``, check the ledger; merges/s."""
    with Ledger(url) as ledger:
        for run in plan.runs:
            ledger.create_run(run, "{}", f"{run}/v/0", "sum0")

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(plan.processes)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(url, plan, seed, barrier, results), daemon=True)
        for seed in range(plan.processes)
    ]
    for proc in procs:
        proc.start()
    reports = []
    try:
        for _ in procs:
            reports.append(results.get(timeout=90))
    except queue.Empty:
        pytest.fail(f"{label}: a worker did not report within 90 s")
    finally:
        for proc in procs:
            # Generous: 16 interpreters winding down on a loaded 2-core machine
            # took more than 10 s (the reports were all in and correct).
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
    errors = [r[2] for r in reports if r[0] == "error"]
    assert not errors, "\n".join(errors)
    assert all(proc.exitcode == 0 for proc in procs)

    totals = Counter[str]()
    for report in reports:
        totals.update(report[2])
    assert totals["merged"] == len(plan.runs) * plan.subtasks
    assert totals["duplicates"] == len(plan.runs) * plan.subtasks * (plan.processes - 1)

    with Ledger(url) as ledger:
        for run in plan.runs:
            _check_run(ledger, run, plan)

    wall = max(r[4] for r in reports) - min(r[3] for r in reports)
    rate = totals["merged"] / wall
    # Per attempt: start, finish and a merge; per head read and per retry one more.
    transactions = 3 * (totals["merged"] + totals["duplicates"]) + totals["heads"]
    transactions += totals["conflicts"]
    line = (
        f"[ledger concurrency] {label}: {plan.processes} processes, {totals['merged']} merges, "
        f"{totals['duplicates']} duplicates, {totals['conflicts']} head conflicts retried "
        f"in {wall:.2f} s -> {rate:.0f} merges/s ({transactions / wall:.0f} ledger transactions/s)"
    )
    with capsys.disabled():
        print("\n" + line)
    if record_property is not None:
        record_property("merges_per_second", round(rate, 1))
        record_property("ledger_transactions_per_second", round(transactions / wall, 1))
        record_property("head_conflicts", totals["conflicts"])
        record_property("summary", line)
    return rate


def _check_run(ledger: Ledger, run: str, plan: Plan) -> None:
    n_subtasks, processes = plan.subtasks, plan.processes
    subtasks = ledger.subtasks(run)
    versions = ledger.versions(run)
    attempts = ledger.attempts(run)
    assert len(subtasks) == n_subtasks  # ensure_subtasks from every process made no extras

    # A contiguous chain v0..vN, each the child of the one before, N == #subtasks.
    assert [v.number for v in versions] == list(range(n_subtasks + 1))
    assert [v.parent for v in versions] == [None, *range(n_subtasks)]
    assert ledger.head(run).number == n_subtasks == ledger.get_run(run).head_version

    # Every subtask merged exactly once, by the version that says so.
    by_subtask = Counter(v.subtask_id for v in versions[1:])
    assert set(by_subtask) == {s.id for s in subtasks}
    assert set(by_subtask.values()) == {1}
    versions_by_subtask = {v.subtask_id: v for v in versions[1:]}
    for sub in subtasks:
        assert sub.state == "merged"
        assert sub.attempts == processes
        assert sub.merged_version == versions_by_subtask[sub.id].number

    # Each subtask: attempts numbered 1..processes, one merged (the version's), the
    # rest duplicates.
    for sub in subtasks:
        mine = [a for a in attempts if a.subtask_id == sub.id]
        assert sorted(a.number for a in mine) == list(range(1, processes + 1))
        assert Counter(a.state for a in mine) == {"merged": 1, "duplicate": processes - 1}
        (winner,) = [a for a in mine if a.state == "merged"]
        assert versions_by_subtask[sub.id].attempt_id == winner.id
        assert all(a.reason and "already merged" in a.reason for a in mine if a is not winner)


def test_concurrent_merges_sqlite(sqlite_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    _contend(sqlite_url, "SQLite (WAL, BEGIN IMMEDIATE)", capsys, Plan())


@pytest.mark.postgres
@pytest.mark.parametrize("isolation", ["read committed", "serializable"])
def test_concurrent_merges_postgres(
    pg_url: str, isolation: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # SERIALIZABLE (a server or role default some operators set) turns lost
    # races into serialization failures: they must surface as HeadConflict or
    # be retried, never as a crash or a double merge.
    url = make_url(pg_url)
    value = isolation.replace(" ", "\\ ")  # libpq options: a space inside a value is escaped
    options = f"{url.query['options']} -cdefault_transaction_isolation={value}"
    url = url.update_query_dict({"options": options})
    _contend(url.render_as_string(hide_password=False), f"PostgreSQL ({isolation})", capsys, Plan())


@pytest.mark.postgres
def test_sixteen_processes_merge_one_run_postgres(
    pg_url: str,
    capsys: pytest.CaptureFixture[str],
    record_property: Callable[[str, object], None],
) -> None:
    """The acceptance test: 16 processes merge the results of one run at once."""
    plan = Plan(processes=16, epochs=2, shards=24, runs=("sixteen",), use_moved_head=True)
    rate = _contend(pg_url, "PostgreSQL, one run", capsys, plan, record_property)
    assert rate > 0
