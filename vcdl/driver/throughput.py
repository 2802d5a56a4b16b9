"""Each worker's measured throughput, and an epoch's throughput plan (``cluster.sizing``).

:func:`throughput_by_worker` (pure) reads a worker's samples a second off the
attempts it trained: samples over training seconds (emulated waits included:
they are the worker's pace), summed over its attempts of the run's earlier
epochs that recorded a result (merged, or waiting to be). :func:`epoch_plan`
(pure) pins shard k to worker ``k % workers`` and sizes every shard by its
worker's throughput over the shards pinned to that worker
(:func:`vcdl.data.sizing.shard_sizes`), so the workers end together.

Workers are known by their Dask *name* (:func:`worker_key`), not their address:
a LocalCluster numbers its workers and ``dask worker --name`` names one, and
the name outlives the address (a restarted worker, a resumed driver's new
cluster), so a resumed epoch's recorded plan is carried out on the workers it
was sized for. Dask names an unnamed worker by its address, and an attempt
recorded before names were (ledger migration 0014) is known by its address:
both are what they were. :func:`pinned_address` finds a pin's worker now.
:func:`plan_epoch` is the I/O edge: it reads the attempts from the ledger;
:func:`planned_sizes` reads an epoch's recorded plan back (a worker cuts its
rows by it, a replay and a what-if weigh its results by it), :func:`planned_rows`
one shard's (the merge's sample check), and
:func:`share_of` is a shard's weight.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from vcdl.config import RunConfig
from vcdl.data.sizing import shard_sizes, size_share
from vcdl.ledger import Attempt, Ledger
from vcdl.runtime import RunRef

MEASURED_STATES = frozenset({"finished", "interrupted", "merged"})
"""Attempts whose samples and seconds are a worker's pace: they trained and recorded it
(a partial result too: its samples are the ones its seconds trained)."""


def worker_key(attempt: Attempt) -> str:
    """The name a worker is measured and pinned by: its Dask name (its address before 0014)."""
    return attempt.worker_name or attempt.worker


def pinned_address(pin: str, fleet: Mapping[str, str]) -> str | None:
    """The address of the worker ``pin`` names in ``fleet`` (address -> name); None: gone.

    A pin is a worker's name, or an address (a plan recorded before 0014, or a
    worker Dask named by its address); an address still in the fleet is itself.
    """
    if pin in fleet:
        return pin
    return next((address for address, name in fleet.items() if name == pin), None)


def throughput_by_worker(attempts: Iterable[Attempt]) -> dict[str, float]:
    """Samples a second of each worker (by :func:`worker_key`), over its attempts that
    trained and recorded it.

    A resumed attempt is left out: its samples count the checkpoint's, trained
    by another worker.
    """
    samples: dict[str, int] = {}
    seconds: dict[str, float] = {}
    for a in attempts:
        if a.state not in MEASURED_STATES or a.resumed_from is not None:
            continue
        if not a.samples or not a.train_seconds or a.train_seconds <= 0 or a.samples <= 0:
            continue
        key = worker_key(a)
        samples[key] = samples.get(key, 0) + a.samples
        seconds[key] = seconds.get(key, 0.0) + a.train_seconds
    return {w: samples[w] / seconds[w] for w in samples}


def epoch_plan(
    n: int, shards: int, workers: Sequence[str], throughput: Mapping[str, float]
) -> tuple[list[int], list[str]] | None:
    """Rows per shard and the worker each shard is pinned to; None: the even plan.

    ``workers``: the fleet's workers now, by :func:`worker_key`. A worker with no measurement
    counts at the median of the fleet's measured workers. With none of them measured (the first
    epoch, or a fleet all new after a resume) there is nothing to size by:
    None, and the epoch is the even plan exactly, its shards unpinned.
    """
    if not workers:
        raise ValueError("a throughput plan needs at least one worker")
    fleet = sorted(workers)
    pinned = [fleet[k % len(fleet)] for k in range(shards)]
    measured = [throughput[w] for w in fleet if w in throughput]
    if not any(w in throughput for w in pinned):
        return None
    median = statistics.median(measured)
    # A worker with several shards trains them one after another: each gets its share
    # of the worker's pace, so that every worker, not every shard, ends together.
    count = Counter(pinned)
    sizes = shard_sizes(n, [throughput.get(w, median) / count[w] for w in pinned])
    return sizes, pinned


def plan_epoch(
    ledger: Ledger, run: str, epoch: int, n: int, shards: int, workers: Sequence[str]
) -> tuple[list[int], list[str]] | None:
    """:func:`epoch_plan` from the throughput the run's attempts before ``epoch`` measured."""
    earlier = [a for a in ledger.attempts(run, states=MEASURED_STATES) if a.epoch < epoch]
    return epoch_plan(n, shards, workers, throughput_by_worker(earlier))


def planned_sizes(ref: RunRef, cfg: RunConfig, epoch: int) -> list[int] | None:
    """The rows of each shard of ``epoch`` under a throughput plan, as the ledger records
    them; None for the even plan (``cluster.sizing = "even"``, or an epoch planned even)."""
    if cfg.cluster.sizing != "throughput":
        return None  # no ledger read: an even run reads what it always has
    subtasks = ref.ledger(fenced=False).subtasks(ref.run, epoch)
    rows = [s.rows for s in sorted(subtasks, key=lambda s: s.shard)]
    if not rows or any(r is None for r in rows):
        return None
    return [int(r) for r in rows if r is not None]


def planned_rows(ref: RunRef, cfg: RunConfig, epoch: int, shard: int) -> int | None:
    """One shard's rows under ``epoch``'s throughput plan; None for the even plan.

    Its own subtask row, filtered in the query: the merge asks for every result,
    and :func:`planned_sizes` reads the whole epoch's (an epoch's plan is recorded
    for all its shards or none, :meth:`vcdl.ledger.Ledger.ensure_subtasks`).
    """
    if cfg.cluster.sizing != "throughput":
        return None
    found = ref.ledger(fenced=False).subtasks(ref.run, epoch, shard=shard)
    return int(found[0].rows) if found and found[0].rows is not None else None


def share_of(sizes: list[int] | None, shard: int) -> float | None:
    """A shard's :func:`~vcdl.data.sizing.size_share` under ``sizes`` (None: even)."""
    if sizes is None:
        return None
    return size_share(sizes[shard], sum(sizes), len(sizes))
