"""``vcdl workers``: each worker of a run, from the ledger: what it trained, how fast, what it lost.

On a fleet of mixed machines the operator's questions are per worker: which
one is slow (the throughput plan sizes its shards by that pace), which one
keeps dying or timing out, whose results come in stale, which one idles.
Every figure here is read off the attempts (and the versions merged from
them); nothing is sampled from the live cluster, so a finished run or one
whose driver died answers the same.

Workers are known as the throughput plan knows them
(:func:`vcdl.driver.throughput.worker_key`): by their Dask name, which a
restarted worker or a resumed driver's new cluster keeps, else by address;
each row lists the addresses the worker had.

* :func:`worker_rows` — the rows. Pure.
* :func:`workers_text` — the table. Pure.
* :func:`read_workers` — the I/O edge: a run's (or an epoch's) rows from the ledger.
"""

from __future__ import annotations

import statistics
import textwrap
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from vcdl.driver.throughput import MEASURED_STATES, throughput_by_worker, worker_key
from vcdl.ledger import Attempt, Ledger, Version, attempt_timings
from vcdl.states import WASTE_ATTEMPT_STATES
from vcdl.views.cost import attempt_seconds
from vcdl.views.story import check_selection, configured_epochs
from vcdl.worker.speed import SPEED_KEY

LEGEND_WIDTH = 100
"""Width of the legend's lines under the table."""

LOST_STATES = frozenset({"killed", "timeout"})
"""Attempts whose worker died or stopped answering (the infrastructure's, not the job's)."""


@dataclass(frozen=True)
class WorkerRow:
    """One worker's figures over the attempts read."""

    worker: str
    """Its Dask name, else its address (attempts recorded before names were)."""
    addresses: list[str]
    attempts: int
    ends: dict[str, int]
    """Attempts by state (merged, killed, timeout, failed, rejected, duplicate, running, …)."""
    samples: int
    """Samples of its attempts that trained and recorded it (merged, or results)."""
    train_seconds: float
    samples_per_s: float | None
    """Its pace as the throughput plan measures it (a resumed attempt left out); None:
    nothing measured yet."""
    attempt_seconds: float
    """Wall seconds of all its attempts, a running one's up to the time read."""
    wasted_seconds: float
    """Of ``attempt_seconds``, those of attempts that will never be merged."""
    busy: float | None
    """``attempt_seconds`` over the span from its first attempt's start to its last
    one's end: 1.0 is one attempt at all times while it was there (a worker with
    several training slots can exceed it). None: no span yet."""
    staleness: float | None
    """Mean staleness (versions) of the merges of its results; None: none merged."""
    speed: float | None = None
    """The emulated speed factor its attempts ran at (``cluster.speeds``), recorded where
    below 1; None: full speed, or a real fleet."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("train_seconds", "attempt_seconds", "wasted_seconds"):
            out[key] = round(out[key], 1)
        for key in ("samples_per_s", "busy", "staleness"):
            if out[key] is not None:
                out[key] = round(out[key], 4)
        return out


def worker_rows(
    attempts: Iterable[Attempt], versions: Iterable[Version], until: datetime
) -> list[WorkerRow]:
    """A row per worker of ``attempts``, the most attempts first (then by name).

    ``versions``: the run's, for the staleness of each merge (a version names
    the attempt it merged); ``until``: the end of attempts still running.
    """
    attempts = list(attempts)
    pace = throughput_by_worker(attempts)
    merged_by = {v.attempt_id: v for v in versions if v.attempt_id is not None}
    groups: dict[str, list[Attempt]] = {}
    for a in attempts:
        groups.setdefault(worker_key(a), []).append(a)
    rows = []
    for key, own in groups.items():
        seconds = [attempt_seconds(a, until)[0] for a in own]
        trained = [a for a in own if a.state in MEASURED_STATES]
        start = min(a.started_at for a in own)
        end = max(a.finished_at or until for a in own)
        span = (end - start).total_seconds()
        stale = [
            v.staleness
            for a in own
            if (v := merged_by.get(a.id)) is not None and v.staleness is not None
        ]
        speeds = [s for a in own if (s := attempt_timings(a).get(SPEED_KEY)) is not None]
        rows.append(
            WorkerRow(
                worker=key,
                addresses=sorted({a.worker for a in own}),
                attempts=len(own),
                ends=dict(sorted(Counter(a.state for a in own).items())),
                samples=sum(a.samples or 0 for a in trained),
                train_seconds=sum(a.train_seconds or 0.0 for a in trained),
                samples_per_s=pace.get(key),
                attempt_seconds=sum(seconds),
                wasted_seconds=sum(
                    s for a, s in zip(own, seconds, strict=True) if a.state in WASTE_ATTEMPT_STATES
                ),
                busy=sum(seconds) / span if span > 0 else None,
                staleness=statistics.fmean(stale) if stale else None,
                speed=statistics.median(speeds) if speeds else None,
            )
        )
    rows.sort(key=lambda r: (-r.attempts, r.worker))
    return rows


def _label(row: WorkerRow) -> str:
    if row.addresses == [row.worker]:
        return row.worker.split("://", 1)[-1]
    more = f" +{len(row.addresses) - 1}" if len(row.addresses) > 1 else ""
    return f"{row.worker}@{row.addresses[-1].split('://', 1)[-1]}{more}"


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def workers_text(run: str, rows: Sequence[WorkerRow], epoch: int | None = None) -> str:
    """The table: a line per worker, then what its columns mean where it is not obvious."""
    where = f"run {run}" + (f", epoch {epoch}" if epoch is not None else "")
    if not rows:
        return f"{where}: no attempt yet"
    emulated = any(r.speed is not None for r in rows)
    width = max(len("worker"), *(len(_label(r)) for r in rows))
    head = (
        f"{'worker':<{width}}  attempts merged  lost failed unused  samples/s   busy  "
        f"stale  wasted s" + ("  speed" if emulated else "")
    )
    lines = [f"{where}: {len(rows)} worker{'s' if len(rows) != 1 else ''}", head]
    for r in rows:
        lost = sum(r.ends.get(s, 0) for s in LOST_STATES)
        unused = r.ends.get("rejected", 0) + r.ends.get("duplicate", 0)
        busy = "-" if r.busy is None else f"{100 * r.busy:.0f} %"
        line = (
            f"{_label(r):<{width}}  {r.attempts:>8} {r.ends.get('merged', 0):>6}  {lost:>4} "
            f"{r.ends.get('failed', 0):>6} {unused:>6}  {_num(r.samples_per_s, '.1f'):>9} "
            f"{busy:>6}  {_num(r.staleness, '.2f'):>5}  {r.wasted_seconds:>8.1f}"
        )
        if emulated:  # an attempt at full speed records no factor
            line += f"  {_num(1.0 if r.speed is None else r.speed, 'g'):>5}"
        lines.append(line)
    legend = (
        "lost: killed or timed out; unused: rejected or a duplicate; samples/s: the pace "
        "the throughput plan sizes shards by; busy: attempt time over the span from the "
        "worker's first attempt to its last; stale: mean staleness of its merges"
        + ("; speed: emulated (cluster.speeds), not a real fleet's" if emulated else "")
    )
    lines += textwrap.wrap(legend, LEGEND_WIDTH)
    return "\n".join(lines)


def read_workers(
    ledger: Ledger, run: str, epoch: int | None = None, now: datetime | None = None
) -> dict[str, Any]:
    """A run's (or one epoch's) worker rows from the ledger, as ``vcdl workers --json``
    prints them: ``run``, ``epoch``, ``read_at``, ``workers`` (a row each, as
    :meth:`WorkerRow.to_dict`). Raises :class:`~vcdl.errors.RunNotFound`, and
    :class:`~vcdl.errors.SubtaskNotFound` for an epoch the run does not have."""
    now = now or datetime.now(UTC)
    row = ledger.get_run(run)  # RunNotFound before anything else
    if epoch is not None:
        epochs = configured_epochs(row.config)
        check_selection(run, ledger.subtasks(run), epoch=epoch, shard=None, epochs=epochs)
    rows = worker_rows(ledger.attempts(run, epoch), ledger.versions(run), now)
    return {
        "run": run,
        "epoch": epoch,
        "read_at": now.isoformat(),
        "workers": [r.to_dict() for r in rows],
    }


def document_text(doc: dict[str, Any]) -> str:
    """:func:`workers_text` of a :func:`read_workers` document."""
    rows = [WorkerRow(**w) for w in doc["workers"]]
    return workers_text(doc["run"], rows, doc["epoch"])
