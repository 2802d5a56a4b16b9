"""The measured fleet points the model must reproduce, the check, and the fit of its two parameters.

Every point is a ``python -m benchmarks.fleet`` run on this project's shared
2-core machine (30-s sleeping attempts, 2 epochs, 2 shards per slot, at most
8 Dask worker processes), copied from ``docs/results.md``, "How many workers
one driver keeps busy", and its history file
(``docs/history/2026-11-24-to-28-issues-31-and-33.md``: "How many workers
one driver keeps busy", "N = 8 and 16 side by side", "What one driver
machine serves", "8 to 128 workers with a small model", "Folding built").
Where a shape was run in several sittings the point is their median and
keeps the runs. The model simulates each with the simulated workers on
the driver's 2 cores (``shared_cores=2``), as they were measured.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from benchmarks.fleetmodel.costs import WORKER_CPU_S, WORKER_CPU_S_PER_GB, costs_for, model_gb
from benchmarks.fleetmodel.sim import Fleet, simulate

__all__ = ["MEASURED", "TOLERANCE", "Point", "calibrate", "fit"]

#: The largest gap, in points of utilization, the model may leave at any measured point.
TOLERANCE = 5.0
#: The measuring machine: the simulated workers share the driver's cores.
CORES = 2.0
ATTEMPT_S = 30.0


@dataclass(frozen=True)
class Point:
    """One measured fleet shape: its utilizations (%), one per run, and where they come from."""

    params: float
    precision: str
    workers: int
    runs: tuple[float, ...]
    source: str

    @property
    def measured(self) -> float:
        return float(statistics.median(self.runs))


MEASURED: tuple[Point, ...] = (
    Point(
        1e6, "full", 8, (97.4,), "fleet.py --workers 8 32 64 128 --params 1e6, 2026-11-28, 2a13df0"
    ),
    Point(1e6, "full", 32, (76.7,), "the same run"),
    Point(1e6, "full", 64, (75.8,), "the same run"),
    Point(1e6, "full", 128, (81.3,), "the same run"),
    Point(
        25e6,
        "full",
        8,
        (90.2, 87.1, 86.8),
        "fleet.py --workers 8: 1d8c436 (11-25), d25d371 and 0c053a7 (11-27)",
    ),
    Point(
        25e6,
        "int8",
        8,
        (84.2,),
        "fleet.py --workers 8 --set merge.result_precision=int8_delta, 2026-11-27, 0c053a7",
    ),
    Point(
        25e6,
        "full",
        16,
        (70.9, 63.5, 60.1, 68.9, 67.8, 76.5),
        "fleet.py --workers 16: d25d371 (11-27, 2 runs); merge.fold=1 runs of f842128 (11-28, 4)",
    ),
    Point(25e6, "full", 32, (68.7,), "fleet.py --workers 8 32, 2026-11-25, 1d8c436"),
)


def simulated(point: Point, worker_cpu_s: float, worker_cpu_s_per_gb: float) -> float:
    """The model's utilization (%) for ``point``'s shape on the measuring machine."""
    costs = costs_for(
        point.params,
        point.precision,
        worker_cpu_s=worker_cpu_s,
        worker_cpu_s_per_gb=worker_cpu_s_per_gb,
    )
    fleet = Fleet(
        workers=point.workers,
        attempt_s=ATTEMPT_S,
        model_gb=model_gb(point.params),
        shared_cores=CORES,
    )
    return 100 * simulate(fleet, costs).utilization


def calibrate(
    worker_cpu_s: float = WORKER_CPU_S,
    worker_cpu_s_per_gb: float = WORKER_CPU_S_PER_GB,
    points: Iterable[Point] = MEASURED,
) -> list[dict[str, object]]:
    """Each point measured against simulated, with its gap in points and whether it is within."""
    rows: list[dict[str, object]] = []
    for p in points:
        sim = simulated(p, worker_cpu_s, worker_cpu_s_per_gb)
        gap = sim - p.measured
        rows.append(
            {
                "params": p.params,
                "precision": p.precision,
                "workers": p.workers,
                "measured": round(p.measured, 2),
                "runs": list(p.runs),
                "simulated": round(sim, 2),
                "gap": round(gap, 2),
                "within": abs(gap) <= TOLERANCE,
                "source": p.source,
            }
        )
    return rows


#: The fit's grid: CPU seconds an attempt, and per GB of model.
CPU_GRID = tuple(round(0.04 * i, 2) for i in range(1, 11))
PER_GB_GRID = tuple(2.0 * i for i in range(11))


def fit(
    cpu_grid: Iterable[float] = CPU_GRID,
    per_gb_grid: Iterable[float] = PER_GB_GRID,
) -> tuple[float, float, int, float]:
    """The grid point of the two worker costs that puts the most points within
    :data:`TOLERANCE`, ties broken by the largest gap (least wins).

    Returns ``(worker_cpu_s, worker_cpu_s_per_gb, points within, largest gap)``.
    """
    best: tuple[float, float, int, float] = (0.0, 0.0, -1, float("inf"))
    for cpu, per_gb in itertools.product(list(cpu_grid), list(per_gb_grid)):
        gaps = [abs(float(r["gap"])) for r in calibrate(cpu, per_gb)]  # type: ignore[arg-type]
        within, worst = sum(g <= TOLERANCE for g in gaps), max(gaps)
        if (within, -worst) > (best[2], -best[3]):
            best = (round(cpu, 4), round(per_gb, 4), within, worst)
    return best
