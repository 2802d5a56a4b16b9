"""The one per-epoch projection of a run, behind `vcdl status`, the epoch tables and the summary.

:func:`epoch_views` groups a run's ledger rows by epoch into
:class:`EpochView` s: subtasks by state, attempts, reissues and rejections,
the newest version and its mean staleness, the test evaluation, and the
training seconds and the part of them that reached a merged version
(goodput, :mod:`vcdl.views.goodput`), and the bytes its attempts read
from and wrote to the store. Status (:mod:`vcdl.views.status`) and
the Prefect artifacts (:mod:`vcdl.views.artifacts`) render these; the cost
report adds its dollars per epoch (:mod:`vcdl.views.cost`). Pure: the rows
come in, nothing is read.

:func:`read_epoch_views` reads the rows, of the whole run or of one epoch
only: the driver publishes each epoch's table at its barrier, and a long
run's every row at every barrier would grow without bound.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from vcdl.ledger import Attempt, Evaluation, Ledger, Subtask, Version, evaluation_metrics
from vcdl.views.goodput import salvaged_attempts, training_seconds, useful_training_seconds


@dataclass(frozen=True)
class EpochView:
    """One epoch of a run, as the ledger has it."""

    epoch: int
    subtasks: int
    merged: int
    dropped: int
    failed: int
    deferred: int
    attempts: int
    reissues: int
    """Attempts beyond a subtask's first."""
    rejections: int
    version: int | None
    """The newest version merged in the epoch."""
    mean_staleness: float | None
    test_accuracy: float | None
    test_loss: float | None
    test_metrics: Mapping[str, float]
    """Every metric of the epoch's test evaluation (the objective's; empty without one)."""
    evaluated_at: datetime | None
    train_seconds: float
    useful_seconds: float
    data_bytes: int = 0
    """Training data the epoch's attempts fetched from the store (those that recorded it)."""
    data_requests: int = 0
    """The store requests (GETs) that fetched ``data_bytes``."""
    written_bytes: int = 0
    """Tensors the epoch's attempts wrote to the store: results and checkpoints."""

    @property
    def goodput(self) -> float | None:
        """Training seconds that reached a merged version / all training seconds."""
        return self.useful_seconds / self.train_seconds if self.train_seconds else None


def epoch_views(
    subtasks: Iterable[Subtask],
    attempts: Iterable[Attempt],
    versions: Iterable[Version],
    evaluations: Iterable[Evaluation],
) -> list[EpochView]:
    """One view per epoch that has subtasks or a test evaluation, by epoch."""
    states: dict[int, Counter[str]] = defaultdict(Counter)
    reissues: Counter[int] = Counter()
    for s in subtasks:
        states[s.epoch][s.state] += 1
        reissues[s.epoch] += max(0, s.attempts - 1)
    outcomes: dict[int, Counter[str]] = defaultdict(Counter)
    spent: dict[int, float] = defaultdict(float)
    useful: dict[int, float] = defaultdict(float)
    read: Counter[int] = Counter()
    written: Counter[int] = Counter()
    gets: Counter[int] = Counter()
    attempts = list(attempts)
    salvaged = salvaged_attempts(attempts)
    for a in attempts:
        outcomes[a.epoch][a.state] += 1
        spent[a.epoch] += training_seconds(a)
        useful[a.epoch] += useful_training_seconds(a, salvaged)
        read[a.epoch] += a.data_bytes or 0
        written[a.epoch] += a.written_bytes or 0
        gets[a.epoch] += a.data_requests or 0
    newest: dict[int, int] = {}
    stale: dict[int, list[int]] = defaultdict(list)
    for v in versions:
        if v.epoch is None:
            continue
        newest[v.epoch] = max(newest.get(v.epoch, 0), v.number)
        if v.staleness is not None:
            stale[v.epoch].append(v.staleness)
    # The last test evaluation recorded for each epoch.
    tests = {e.epoch: e for e in evaluations if e.split == "test" and e.epoch is not None}
    views = []
    for epoch in sorted(set(states) | set(tests)):
        ev, st, n = tests.get(epoch), stale.get(epoch, []), states[epoch]
        views.append(
            EpochView(
                epoch=epoch,
                subtasks=sum(n.values()),
                merged=n["merged"],
                dropped=n["dropped"],
                failed=n["failed"],
                deferred=n["deferred"],
                attempts=sum(outcomes[epoch].values()),
                reissues=reissues[epoch],
                rejections=outcomes[epoch]["rejected"],
                version=newest.get(epoch),
                mean_staleness=sum(st) / len(st) if st else None,
                test_accuracy=ev.accuracy if ev else None,
                test_loss=ev.loss if ev else None,
                test_metrics=evaluation_metrics(ev) if ev else {},
                evaluated_at=ev.created_at if ev else None,
                train_seconds=spent[epoch],
                useful_seconds=useful[epoch],
                data_bytes=read[epoch],
                data_requests=gets[epoch],
                written_bytes=written[epoch],
            )
        )
    return views


def read_epoch_views(ledger: Ledger, run: str, epoch: int | None = None) -> list[EpochView]:
    """The run's views from the ledger: every epoch's, or ``epoch``'s only (its rows only)."""
    evaluations = [e for e in ledger.evaluations(run) if epoch is None or e.epoch == epoch]
    return epoch_views(
        ledger.subtasks(run, epoch),
        ledger.attempts(run, epoch),
        ledger.versions(run, epoch=epoch),
        evaluations,
    )


def format_metrics(metrics: Mapping[str, float], first: str | None = None) -> str:
    """``"loss 1.234, perplexity 3.440"``: an evaluation's metrics in one short line.

    ``first`` (the objective's headline) leads; the rest follow by name.
    Four significant digits, which is what a person compares, trailing zeros
    kept so that successive lines line up (``0.7000``, not ``0.7``).
    """
    names = sorted(metrics, key=lambda k: (k != first, k != "loss", k))
    return ", ".join(f"{k.replace('_', ' ')} {metrics[k]:#.4g}" for k in names) or "-"
