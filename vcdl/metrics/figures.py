"""What the driver's Prometheus metrics say, computed from one read of a run's ledger rows.

Pure functions over ledger rows, no I/O: :func:`ledger_figures` turns a
run's row, subtasks, attempts, versions and evaluations into
:class:`Figures`, which :mod:`vcdl.metrics.exporter` renders for Prometheus.
The counts follow the definitions of ``vcdl status``
(:mod:`vcdl.views.status`) and ``vcdl cost`` (:mod:`vcdl.views.cost`), so the
endpoint, the CLI and the ledger agree by construction.

Prometheus counters must never go down. Only figures the ledger can only
grow are rendered as counters: attempt rows, attempts in a final state
(:data:`FINAL_OUTCOMES`: nothing moves out of them), versions, reissues
(``subtask.attempts`` only grows), staleness of versions (immutable rows)
and the phases of attempts in a final state. Everything that can move
(attempts running, killed ones that turn out alive) is a gauge.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from prometheus_client.utils import floatToGoString

from vcdl.ledger import Attempt, Evaluation, Run, Subtask, Version, attempt_timings
from vcdl.ledger.versions import evaluation_metrics
from vcdl.states import ATTEMPT_MOVES, ENDED_RUN_STATES
from vcdl.views.cost import cost_summary
from vcdl.views.goodput import salvaged_attempts, training_seconds, useful_training_seconds
from vcdl.views.prices import PriceTable
from vcdl.worker.checkpoints import FAILURES_KEY

FINAL_OUTCOMES: frozenset[str] = frozenset(s for s, moves in ATTEMPT_MOVES.items() if not moves)
"""Attempt states nothing leaves (merged, rejected, duplicate, failed): countable."""

MERGE_PHASE_PREFIX = "assimilator_"
"""Phases the assimilator records on an attempt it merged or rejected."""

STALENESS_BUCKETS: tuple[float, ...] = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
SECONDS_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    900,
)

# Reason classes of rejected results, first match wins; the reasons are the
# assimilator's and the epoch state machine's own texts (vcdl.driver.assimilator,
# vcdl.merge.checks, vcdl.driver.epoch_state). A bounded set: labels, not free text.
_REJECTION_CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("stale", ("stale:",)),
    ("partial_discarded", ("discarded by policy",)),
    ("bad_report", ("bad report from the worker",)),
    ("unreadable", ("unreadable", "not found", "incomplete")),
    ("non_finite", ("NaN", "Inf values", "not finite")),
    ("update_norm", ("max_update_norm",)),
    ("shape", ("key sets differ", "shape", "dtype", "not a torch.Tensor", "not a state")),
    ("encoding", ("encoding",)),
)


def rejection_class(reason: str | None) -> str:
    """The class of a rejected result's reason: stale, bad_report, non_finite, ... or other."""
    text = reason or ""
    for name, needles in _REJECTION_CLASSES:
        if any(n in text for n in needles):
            return name
    return "other"


REJECTION_CLASSES: tuple[str, ...] = (*(name for name, _ in _REJECTION_CLASSES), "other")


@dataclass(frozen=True)
class Histogram:
    """Observations put in cumulative buckets, as Prometheus exposes them."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    """Cumulative: observations <= each bound, then the total (+Inf)."""
    total: float

    @classmethod
    def of(cls, values: Iterable[float], bounds: Sequence[float]) -> Histogram:
        bounds = tuple(float(b) for b in bounds)
        values = sorted(values)
        counts, i = [], 0
        for b in bounds:
            while i < len(values) and values[i] <= b:
                i += 1
            counts.append(i)
        counts.append(len(values))
        return cls(bounds, tuple(counts), float(sum(values)))

    @property
    def count(self) -> int:
        return self.counts[-1]

    def buckets(self) -> list[tuple[str, float]]:
        """(le, cumulative count) pairs, +Inf last: what HistogramMetricFamily takes."""
        les = [_le(b) for b in self.bounds] + ["+Inf"]
        return [(le, float(n)) for le, n in zip(les, self.counts, strict=True)]


def _le(bound: float) -> str:
    return floatToGoString(bound)  # "2.0", "0.005": as prometheus_client writes its own


@dataclass(frozen=True)
class Figures:
    """A run's metrics at one read of its ledger rows."""

    state: str
    head_version: int
    epochs: int
    epochs_completed: int
    attempts_started: int
    attempts_by_state: Mapping[str, int]
    outcomes: Mapping[str, int]
    """Attempts in each of :data:`FINAL_OUTCOMES`."""
    merges: int
    reissues: int
    rejections: Mapping[str, int]
    """Rejected attempts by :func:`rejection_class`."""
    staleness: Histogram
    attempt_phases: Mapping[str, Histogram]
    merge_phases: Mapping[str, Histogram]
    merge_seconds: Histogram
    """Per merged attempt, the assimilator's phases together."""
    train_seconds: float
    useful_seconds: float
    spend_usd: float | None = None
    waste_usd: float | None = None
    evaluation: Mapping[str, float] = field(default_factory=dict)
    evaluation_version: int | None = None

    @property
    def goodput(self) -> float | None:
        """Useful / all training seconds (``vcdl status``'s goodput); None before any."""
        return self.useful_seconds / self.train_seconds if self.train_seconds else None


def _phases(
    attempts: Iterable[Attempt],
) -> tuple[dict[str, list[float]], dict[str, list[float]], list[float]]:
    """Seconds per phase of the attempts in a final state: the attempt's own, the merge's;
    and per merged attempt, the merge's phases together. One parse of each breakdown."""
    own: dict[str, list[float]] = {}
    merge: dict[str, list[float]] = {}
    totals: list[float] = []
    for a in attempts:
        if a.state not in FINAL_OUTCOMES:
            continue
        merged: list[float] = []
        for name, seconds in attempt_timings(a).items():
            if name == FAILURES_KEY or not (math.isfinite(seconds) and seconds >= 0):
                continue  # a count, not a phase; or not a duration at all
            if name.startswith(MERGE_PHASE_PREFIX):
                merge.setdefault(name.removeprefix(MERGE_PHASE_PREFIX), []).append(seconds)
                merged.append(seconds)
            else:
                own.setdefault(name, []).append(seconds)
        if merged and a.state == "merged":
            totals.append(sum(merged))
    return own, merge, totals


def ledger_figures(
    run: Run,
    epochs: int,
    subtasks: Sequence[Subtask],
    attempts: Sequence[Attempt],
    versions: Sequence[Version],
    evaluations: Sequence[Evaluation],
    prices: PriceTable | None = None,
    *,
    now: datetime,
    instance_type: str = "",
    worker_types: Mapping[str, str] | None = None,
) -> Figures:
    """The run's :class:`Figures` from its rows; spend only with ``prices``."""
    states = Counter(a.state for a in attempts)
    salvaged = salvaged_attempts(attempts)
    own, merge, merge_totals = _phases(attempts)
    tests = [e for e in evaluations if e.split == "test"]
    latest = max(tests, key=lambda e: (e.version, e.id or 0)) if tests else None
    spend = waste = None
    if prices is not None:
        cost = cost_summary(
            attempts,
            prices,
            until=now,
            run_ended=run.state in ENDED_RUN_STATES,
            instance_type=instance_type,
            worker_types=worker_types,
        )
        spend, waste = cost["total_usd"], cost["waste_usd"]
    return Figures(
        state=run.state,
        head_version=run.head_version,
        epochs=epochs,
        epochs_completed=run.epochs_completed,
        attempts_started=len(attempts),
        attempts_by_state=dict(sorted(states.items())),
        outcomes={s: states.get(s, 0) for s in sorted(FINAL_OUTCOMES)},
        merges=sum(1 for v in versions if v.subtask_id is not None),
        reissues=sum(max(0, s.attempts - 1) for s in subtasks),
        rejections=dict(
            sorted(
                Counter(
                    rejection_class(a.reason) for a in attempts if a.state == "rejected"
                ).items()
            )
        ),
        staleness=Histogram.of(
            (v.staleness for v in versions if v.staleness is not None), STALENESS_BUCKETS
        ),
        attempt_phases={k: Histogram.of(v, SECONDS_BUCKETS) for k, v in sorted(own.items())},
        merge_phases={k: Histogram.of(v, SECONDS_BUCKETS) for k, v in sorted(merge.items())},
        merge_seconds=Histogram.of(merge_totals, SECONDS_BUCKETS),
        train_seconds=sum(training_seconds(a) for a in attempts),
        useful_seconds=sum(useful_training_seconds(a, salvaged) for a in attempts),
        spend_usd=spend,
        waste_usd=waste,
        evaluation=evaluation_metrics(latest) if latest is not None else {},
        evaluation_version=latest.version if latest is not None else None,
    )
