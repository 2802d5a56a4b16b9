"""Shard sizes by measured throughput (``cluster.sizing = "throughput"``). Pure.

:func:`shard_sizes` maps an epoch's ``n`` training rows and one throughput
per shard (samples a second of the worker the shard is pinned to; None: not
measured yet) to the rows of each shard: every row of the epoch in exactly
one shard (sizes sum to ``n``, each at least 1), each shard's size
proportional to its throughput, so every shard's planned time
(size / throughput) is about ``n / sum(throughputs)``.

The stated factor: rounding moves a shard by less than one row from its exact
share ``q = n * t / sum(t)``, so its planned time is within ``(1 ± 1/q)`` of
the exact one, and the slowest planned time is at most
:func:`time_spread_bound` (``(q_min + 1) / (q_min - 1)``) times the fastest,
whenever every exact share ``q_min`` is over one row (e.g. within 1.25x for
shares of 9 rows or more). A shard without a measurement gets the median of
the measured ones; with none measured the sizes are even, exactly the sizes
of the ``even`` plan (:func:`vcdl.data.shards.shard_plan`: the first
``n % shards`` one row larger). The arithmetic is exact (fractions), so
equal throughputs give even sizes whatever their floating-point sum.

:func:`size_share` is a shard's size relative to the epoch's mean shard:
what its result weighs in the merge (docs/uneven-fleets.md).
"""

from __future__ import annotations

import operator
import statistics
from collections.abc import Sequence
from fractions import Fraction

from vcdl.errors import DataError


def fill_unmeasured(throughputs: Sequence[float | None]) -> list[float] | None:
    """Each shard's throughput, a missing one the median of the measured; None if none is."""
    measured = [float(t) for t in throughputs if t is not None]
    for t in measured:
        if not t > 0 or t == float("inf"):
            raise DataError(f"a throughput must be a positive finite number, got {t}")
    if not measured:
        return None
    median = statistics.median(measured)
    return [median if t is None else float(t) for t in throughputs]


def even_sizes(n: int, shards: int) -> list[int]:
    """The ``even`` plan's sizes: ``n // shards`` each, the first ``n % shards`` one more."""
    base, extra = divmod(n, shards)
    return [base + (1 if k < extra else 0) for k in range(shards)]


def shard_sizes(n: int, throughputs: Sequence[float | None]) -> list[int]:
    """Rows per shard, proportional to each shard's throughput (module docstring).

    One entry of ``throughputs`` per shard, in shard order. Largest remainder
    rounding, ties to the lower shard; a shard whose share rounds to 0 gets 1
    row, taken from the largest shard.
    """
    n = operator.index(n)
    shards = len(throughputs)
    if shards < 1 or shards > n:
        raise DataError(f"need between 1 and n={n} shards, got {shards}")
    filled = fill_unmeasured(throughputs)
    if filled is None:
        return even_sizes(n, shards)
    exact = [Fraction(t) for t in filled]
    total = sum(exact, Fraction(0))
    shares = [n * t / total for t in exact]
    sizes = [int(q) for q in shares]  # floor: shares are positive
    rest = n - sum(sizes)
    by_remainder = sorted(range(shards), key=lambda k: (-(shares[k] - sizes[k]), k))
    for k in by_remainder[:rest]:
        sizes[k] += 1
    for k in range(shards):
        if sizes[k] == 0:
            largest = max(range(shards), key=lambda j: (sizes[j], -j))
            sizes[largest] -= 1
            sizes[k] = 1
    return sizes


def planned_times(sizes: Sequence[int], throughputs: Sequence[float]) -> list[float]:
    """Each shard's planned seconds: its size over its throughput."""
    return [s / t for s, t in zip(sizes, throughputs, strict=True)]


def time_spread_bound(n: int, throughputs: Sequence[float]) -> float:
    """The stated factor: the most the slowest planned time may exceed the fastest.

    ``(q_min + 1) / (q_min - 1)`` for the smallest exact share ``q_min``;
    infinite when a share is one row or less (rounding alone may then double
    or zero a shard).
    """
    total = sum(Fraction(t) for t in throughputs)
    q_min = min(n * Fraction(t) / total for t in throughputs)
    if q_min <= 1:
        return float("inf")
    return float((q_min + 1) / (q_min - 1))


def size_share(rows: int, n: int, shards: int) -> float:
    """A shard's size relative to the epoch's mean shard (``n / shards`` rows)."""
    if rows < 1 or n < 1 or shards < 1:
        raise DataError(f"need rows, n and shards >= 1, got {rows}, {n}, {shards}")
    return rows * shards / n
