"""A fleet model's calibration against the measured fleets, then its projection to larger ones.

No fleet runs here: ``benchmarks/fleetmodel/`` simulates one
(docs/fleet-model.md). First the calibration: every measured
``benchmarks/fleet.py`` point (8-128 slots, 1M and 25M parameters, on this
2-core machine; ``benchmarks/fleetmodel/calibration.py`` names each run)
simulated as it was measured, the simulated workers sharing the driver's 2
cores, and its gap to the measured utilization; the calibration holds when
every gap is within 5 points. Then the projection, workers on machines of
their own: utilization for 64, 256 and 1,024 workers, 25M / 100M / 1B
parameters, attempts of 30 s, 2 min and 10 min, full and int8 results, K = 1
to 16 mergers, the run shape of ``fleet.py`` (2 epochs, 2 shards per
worker). Reported: the least K giving >= 256 workers at >= 90 % with 25M
parameters and 30-s attempts (issue 52's target) -- a projection of the
model, and one to trust only as far as the calibration held.

Options: ``--shards-per-worker`` (an epoch's shards per worker in the
projection; default 2, ``fleet.py``'s: each epoch's barrier then weighs on
every second attempt), ``--fit`` (redo the fit of the model's two fitted costs, a grid,
about a minute), ``--seed``, ``--attempt-cv`` (the spread of an attempt's
time, lognormal; default 0.1), and the common ones of
``benchmarks/harness.py`` (``--quick``: the calibration and the target's
row only; ``--json``, ``--out``; no ``--repeats``: the model is
deterministic for a seed).

    python -m benchmarks.fleetsim
    python -m benchmarks.fleetsim --quick      # CI: calibration + the target's row, ~1 s
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any

from benchmarks.fleetmodel.calibration import TOLERANCE, calibrate, fit
from benchmarks.fleetmodel.costs import (
    WORKER_CPU_S,
    WORKER_CPU_S_PER_GB,
    costs_for,
    model_gb,
)
from benchmarks.fleetmodel.sim import Fleet, simulate
from benchmarks.harness import add_common_options, emit_summary, human_output

TARGET_WORKERS, TARGET_UTIL, TARGET_PARAMS, TARGET_ATTEMPT_S = 256, 0.90, 25e6, 30.0
WORKERS = (64, 256, 1024)
PARAMS = (25e6, 1e8, 1e9)
ATTEMPTS_S = (30.0, 120.0, 600.0)
MERGERS = (1, 2, 4, 8, 16)
PRECISIONS = ("full", "int8")


def project(
    workers: int,
    params: float,
    attempt_s: float,
    mergers: int,
    precision: str = "full",
    *,
    attempt_cv: float = 0.1,
    seed: int = 0,
    shards_per_worker: int = 2,
) -> float:
    """The model's utilization for one shape, workers on machines of their own."""
    fleet = Fleet(
        workers=workers,
        attempt_s=attempt_s,
        model_gb=model_gb(params),
        mergers=mergers,
        attempt_cv=attempt_cv,
        seed=seed,
        shards_per_worker=shards_per_worker,
    )
    return simulate(fleet, costs_for(params, precision)).utilization


def least_k_for_target(attempt_cv: float, seed: int, shards_per_worker: int) -> int | None:
    """The least K of :data:`MERGERS` at which the target's shape reaches the target."""
    for k in MERGERS:
        u = project(
            TARGET_WORKERS,
            TARGET_PARAMS,
            TARGET_ATTEMPT_S,
            k,
            attempt_cv=attempt_cv,
            seed=seed,
            shards_per_worker=shards_per_worker,
        )
        if u >= TARGET_UTIL:
            return k
    return None


def print_calibration(rows: list[dict[str, Any]]) -> None:
    print(f"calibration: measured vs simulated utilization, % (within {TOLERANCE:g} points?)")
    print(
        f"{'params':>7} {'results':>7} {'N':>4} {'measured':>9} {'simulated':>9} {'gap':>6}  runs"
    )
    for r in rows:
        print(
            f"{r['params'] / 1e6:6.0f}M {r['precision']:>7} {r['workers']:4} {r['measured']:9.1f} "
            f"{r['simulated']:9.1f} {r['gap']:+6.1f}{'' if r['within'] else ' MISS'}  "
            + ", ".join(f"{x:g}" for x in r["runs"])
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fit", action="store_true", help="redo the fit of the two worker costs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--attempt-cv", type=float, default=0.1, help="an attempt's time spread")
    p.add_argument(
        "--shards-per-worker",
        type=int,
        default=2,
        help="an epoch's shards per worker in the projection (fleet.py's 2 by default)",
    )
    add_common_options(p, quick_help="CI: calibration and the target's row only", repeats=False)
    args = p.parse_args()
    figures: dict[str, Any] = {}
    with human_output(args):
        cpu, per_gb = WORKER_CPU_S, WORKER_CPU_S_PER_GB
        if args.fit:
            cpu, per_gb, within, worst = fit()
            print(
                f"fit: worker CPU {cpu} s an attempt + {per_gb} s per GB "
                f"({within} within, worst {worst:.1f})"
            )
        rows = calibrate(cpu, per_gb)
        print_calibration(rows)
        calibrated = all(r["within"] for r in rows)
        print(
            f"calibration {'HOLDS' if calibrated else 'MISSED'}: "
            f"{sum(bool(r['within']) for r in rows)} of {len(rows)} points within {TOLERANCE:g}"
            + ("" if calibrated else "; the projection below is not calibrated")
        )
        figures.update(
            worker_cpu_s=cpu, worker_cpu_s_per_gb=per_gb, calibration=rows, calibrated=calibrated
        )
        grid = (
            [(TARGET_WORKERS, TARGET_PARAMS, TARGET_ATTEMPT_S, "full")]
            if args.quick
            else list(itertools.product(WORKERS, PARAMS, ATTEMPTS_S, PRECISIONS))
        )
        print(
            "\nprojection, workers on machines of their own, 2 epochs of "
            f"{args.shards_per_worker} shards a worker: utilization %, K mergers"
        )
        print(
            f"{'N':>5} {'params':>6} {'attempt':>8} {'results':>7} "
            + " ".join(f"K={k:<4}" for k in MERGERS)
        )
        table = []
        for n, params, attempt_s, precision in grid:
            utils = [
                project(
                    n,
                    params,
                    attempt_s,
                    k,
                    precision,
                    attempt_cv=args.attempt_cv,
                    seed=args.seed,
                    shards_per_worker=args.shards_per_worker,
                )
                for k in MERGERS
            ]
            table.append(
                {
                    "workers": n,
                    "params": params,
                    "attempt_s": attempt_s,
                    "precision": precision,
                    "utilization_by_k": {
                        str(k): round(u, 4) for k, u in zip(MERGERS, utils, strict=True)
                    },
                }
            )
            print(
                f"{n:5} {params / 1e6:5.0f}M {attempt_s:7.0f}s {precision:>7} "
                + " ".join(f"{100 * u:6.1f}" for u in utils)
            )
        k = least_k_for_target(args.attempt_cv, args.seed, args.shards_per_worker)
        verdict = "met" if k is not None else "MISSED"
        print(
            f"\ntarget, >= {TARGET_WORKERS} workers at >= {100 * TARGET_UTIL:.0f} %, "
            f"25M parameters, 30-s attempts: {verdict} in the model"
            + (f" with K = {k}" if k is not None else f" at every K up to {MERGERS[-1]}")
            + (
                " (a projection; the calibration holds)"
                if calibrated
                else " (uncalibrated projection)"
            )
        )
        figures.update(projection=table, target_k=k, target_met=k is not None)
    emit_summary("fleetsim", figures, args)


if __name__ == "__main__":
    main()
