"""The model's costs: which are measured (and where), which two are fitted, and the merge by size.

Measured directly, each figure from a run named in ``docs/results.md`` or
its history file (``docs/history/2026-11-24-to-28-issues-31-and-33.md``):

- ``merge_seconds``: one merge, by model size and result precision;
- ``DRIVER_S`` and ``API_S``: the driver process's and the Prefect API
  server's CPU seconds per attempt, the slope of their sampled CPU seconds
  against attempts in the 1M-parameter runs at 8–128 slots (2a13df0:
  driver 9.4, 15.7, 20.5, 35.8 s over 32, 128, 256, 512 attempts, API
  server 2.5, 5.8, 9.7, 17.9 s): 0.054 and 0.032 s, with 7.8 and 1.6 s of
  fixed cost a run that the model leaves out (0.06 of a core);
- ``LEDGER_S``: PostgreSQL's writer + server CPU per merge, 1.54 + 1.13 ms
  (``benchmarks/ledger.py``, 2fbd256), twice (the claim and the merge);
- ``BARRIER_S``: Prefect's round trips at an epoch subflow's boundary,
  0.15–0.25 s (docs/design.md, "Pipelined epoch subflows");
- ``OWN_MERGE_WAIT_S``: ``vcdl/worker/slots.py``'s ``OWN_MERGE_WAIT``
  (a test checks they agree).

Fitted, once, on all the calibration points together (never per point):
``WORKER_CPU_S`` and ``WORKER_CPU_S_PER_GB``, the CPU seconds a worker
spends around one attempt (Prefect's task engine, the claim, reading the
base and writing the result), size-free and per GB of model. The fleet
benchmark cannot measure them uncontended: its workers share the driver's
2 cores, and the phases it reports (Prefect's engine 0.5–5.0 s, the claim
0.1–1.0 s an attempt) are those costs stretched by the sharing, which is
what the model reproduces. ``python -m benchmarks.fleetsim --fit`` redoes
the fit.

Not measured, assumed: ``PUBLISH_S`` (K > 1 mergers gathering their ranges'
checksums before the head's compare-and-swap; nothing sharded is built yet:
the ledger's part of a merge, 0.006–0.028 s, plus as much again), and an
int8 result's merge at sizes other than 25M (the 25M ratio, 0.62 ÷ 0.47).
"""

from __future__ import annotations

from benchmarks.fleetmodel.sim import Costs

__all__ = [
    "API_S",
    "BARRIER_S",
    "DRIVER_S",
    "LEDGER_S",
    "MERGE_S",
    "OWN_MERGE_WAIT_S",
    "PUBLISH_S",
    "WORKER_CPU_S",
    "WORKER_CPU_S_PER_GB",
    "costs_for",
    "merge_seconds",
    "model_gb",
]

DRIVER_S = 0.054
API_S = 0.032
LEDGER_S = 2 * (0.00154 + 0.00113)
BARRIER_S = 0.2
OWN_MERGE_WAIT_S = 1.0
PUBLISH_S = 0.05

# Fitted: python -m benchmarks.fleetsim --fit (see docs/fleet-model.md).
WORKER_CPU_S = 0.28
WORKER_CPU_S_PER_GB = 4.0

#: Seconds of one merge of a float32 result, by parameters: measured.
MERGE_S: dict[float, tuple[float, str]] = {
    1e6: (0.03, "fleet.py --params 1e6, 4 MB, 2026-11-28, 2a13df0"),
    25e6: (0.47, "fleet.py --workers 8, 100 MB, 0.46-0.48 s, 2026-11-27/28, 0c053a7, f842128"),
    1e8: (0.70, "big_merge.py --modes serial --fold 1, 403 MB, 0.699 s, 2026-11-27, a403ee7"),
    1e9: (8.76, "big_merge.py --params 1e9 streamed, 4.03 GB, 2026-11-25, 1d8c436"),
}
#: An int8 result's merge ÷ a float32 one's: 0.62 ÷ 0.47 s at 25M (0c053a7), measured there only.
INT8_FACTOR = 0.62 / 0.47


def model_gb(params: float) -> float:
    """A float32 model's size in GB."""
    return 4 * params / 1e9


def merge_seconds(params: float, precision: str = "full") -> float:
    """One merge's seconds: measured sizes exactly, linear in bytes between them.

    Raises :class:`ValueError` outside 1M-1B parameters or for a precision
    other than ``full`` and ``int8``: the model does not extrapolate merges.
    """
    if precision not in ("full", "int8"):
        raise ValueError(f"precision {precision!r}: full or int8")
    sizes = sorted(MERGE_S)
    if not sizes[0] <= params <= sizes[-1]:
        raise ValueError(f"{params:g} parameters: merges measured for {sizes[0]:g}-{sizes[-1]:g}")
    lo = max(s for s in sizes if s <= params)
    hi = min(s for s in sizes if s >= params)
    m_lo, m_hi = MERGE_S[lo][0], MERGE_S[hi][0]
    m = m_lo if hi == lo else m_lo + (m_hi - m_lo) * (params - lo) / (hi - lo)
    return m * (INT8_FACTOR if precision == "int8" else 1.0)


def costs_for(
    params: float,
    precision: str = "full",
    *,
    worker_cpu_s: float = WORKER_CPU_S,
    worker_cpu_s_per_gb: float = WORKER_CPU_S_PER_GB,
) -> Costs:
    """The model's costs for ``params`` float32 parameters (the fit's values unless given)."""
    return Costs(
        worker_cpu_s=worker_cpu_s,
        worker_cpu_s_per_gb=worker_cpu_s_per_gb,
        api_s=API_S,
        driver_s=DRIVER_S,
        ledger_s=LEDGER_S,
        merge_s=merge_seconds(params, precision),
        publish_s=PUBLISH_S,
        barrier_s=BARRIER_S,
        own_merge_wait_s=OWN_MERGE_WAIT_S,
    )
