"""What a run cost on spot machines, what it wasted, and what it saved.

This module owns cost accounting: the cost of an attempt
(:func:`attempt_cost`) and the report of a run built from the ledger
(:func:`cost_report`, printed by :func:`format_cost`), at the prices of
:mod:`vcdl.views.prices`. Pure functions over ledger rows; the only I/O is
reading the price files and the ledger.

Definitions (every figure in the report follows them):

* **Worker-seconds** of an attempt = its wall time, ``finished_at -
  started_at``. An attempt with no ``finished_at`` (still running, or
  SIGKILLed and never recorded) is counted up to ``until`` (default: the
  run's ``updated_at``, the last time the driver wrote to the run): an
  **upper bound** of what it ran; ``upper_bound_seconds`` says how many
  seconds of the total are such estimates. Killed attempts that the driver
  did record carry the time the loss was *noticed*, also an upper bound.
  Boot time, idle time between attempts, disks, egress and the driver's own
  (on-demand) machine are not counted: per attempt, billed time is a lower
  bound of the instance bill.
* **Cost** of an attempt = worker-seconds / 3600 × the spot $/hour of its
  worker's instance type. ``total_usd`` is the sum over every attempt.
* **Useful** attempts are the ``merged`` ones. **Waste** is every attempt
  that will never be merged: killed, timeout, rejected, duplicate, failed,
  stale, and an interrupted partial result that was discarded. While the
  run is still going (state not ``completed``/``failed``), ``running``,
  ``finished`` (result awaiting its merge) and ``interrupted`` attempts are
  **pending**, neither useful nor waste yet; once the run has ended they are
  waste.
* **On-demand equivalent** = the same worker-seconds (all of them) at the
  on-demand price. ``spot_discount = 1 − total_usd / on_demand_equivalent_usd``:
  the seconds-weighted spot discount of the instance types used, the best
  savings spot could give.
* **Realized savings** = ``1 − spot_cost / on_demand_cost_of_merged_work``
  where ``spot_cost`` is the cost of every decided attempt (useful + waste,
  pending excluded) and ``on_demand_cost_of_merged_work`` is the wall time of
  the merged attempts at the on-demand price: what the same useful work
  would have cost on on-demand machines that are never killed (no retries,
  no duplicates). ``savings_usd`` is the difference in dollars. With no
  waste, realized savings equal the spot discount; waste pulls them below
  it. ``savings_gap_points = 100 × (spot_discount − realized_savings)``
  measures that loss, e.g. against a target of "realized savings within 5
  points of the spot discount at the kill schedule".

A killed attempt whose checkpoint a replacement resumed (``fault.checkpoint_seconds``),
directly or through further resumed attempts, ending in a merged result, is
useful for the training its checkpoint kept (``train_seconds``, recorded with
the checkpoint) and waste for the rest of its time: the merged replacement's
own wall time covers only the samples the checkpoint had not seen.

**Data** an attempt read from the store (``attempt.data_bytes`` in
``data_requests`` GETs, every attempt's, merged or wasted) is priced where
the store is S3 (``[storage.s3]`` of the price table): GETs at
``get_per_1000``, bytes at the transfer price of ``cost.data_transfer``
(same region: free; cross-region; internet). ``data_usd`` is None for other
stores and is not part of ``total_usd`` (the instance bill).

A merged partial result (``fault.partial = "scale"``) counts as useful at
its own, shorter, wall time: on-demand would have run the full shard, so
realized savings are slightly overstated in runs with many notices.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from vcdl.config import CostSection
from vcdl.ledger import Attempt, Ledger
from vcdl.states import (
    ENDED_RUN_STATES,
    PENDING_ATTEMPT_STATES,
    USEFUL_ATTEMPT_STATES,
)
from vcdl.views.goodput import salvaged_attempts, useful_training_seconds
from vcdl.views.prices import (
    DEFAULT_INSTANCE_TYPE,
    TRANSFERS,
    Price,
    PriceTable,
    StoragePrice,
    instance_for,
    load_prices,
    run_prices,
)

# Decided only once the run has ended: until then the attempt may still merge.


# --------------------------------------------------------------------------
# Prices
# --------------------------------------------------------------------------


# --------------------------------------------------------------------------
# Attempts
# --------------------------------------------------------------------------


def attempt_cost(seconds: float, price_per_hour: float) -> float:
    """USD for ``seconds`` of one machine at ``price_per_hour``."""
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"seconds must be finite and >= 0, got {seconds!r}")
    if not (math.isfinite(price_per_hour) and price_per_hour >= 0):
        raise ValueError(f"price_per_hour must be finite and >= 0, got {price_per_hour!r}")
    return seconds / 3600.0 * price_per_hour


def attempt_seconds(attempt: Attempt, until: datetime) -> tuple[float, bool]:
    """Wall seconds of ``attempt`` and whether they are an estimate (no ``finished_at``).

    Without ``finished_at`` the attempt is counted up to ``until`` (an upper
    bound). Clock skew never gives negative time: it is clamped to 0.
    """
    end = attempt.finished_at
    estimated = end is None
    if end is None:
        end = until
    return max(0.0, (end - attempt.started_at).total_seconds()), estimated


def data_cost(
    data_bytes: int, requests: int, storage: StoragePrice | None, transfer: str
) -> float | None:
    """USD for reading ``data_bytes`` in ``requests`` GETs from a priced object store.

    None when the store has no price (a local directory).
    """
    if storage is None:
        return None
    return (
        requests / 1000.0 * storage.get_per_1000
        + data_bytes / 2**30 * storage.transfer_per_gb[transfer]
    )


def outcome(state: str, run_ended: bool) -> str:
    """``"useful"``, ``"waste"`` or ``"pending"`` for an attempt in ``state``."""
    if state in USEFUL_ATTEMPT_STATES:
        return "useful"
    if state in PENDING_ATTEMPT_STATES and not run_ended:
        return "pending"
    return "waste"


# --------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------


class _Tally:
    """Sums of seconds, spot and on-demand dollars by outcome."""

    def __init__(self) -> None:
        self.attempts = 0
        self.merged = 0
        self.samples = 0
        self.data_bytes = 0
        self.data_requests = 0
        self.written_bytes = 0
        self.seconds: dict[str, float] = defaultdict(float)
        self.spot: dict[str, float] = defaultdict(float)
        self.on_demand: dict[str, float] = defaultdict(float)

    def add(self, kind: str, seconds: float, price: Price, samples: int | None) -> None:
        self.attempts += 1
        self.seconds[kind] += seconds
        self.spot[kind] += attempt_cost(seconds, price.spot)
        self.on_demand[kind] += attempt_cost(seconds, price.on_demand)
        if kind == "useful":
            self.merged += 1
            self.samples += samples or 0

    def add_traffic(self, attempt: Attempt) -> None:
        self.data_bytes += attempt.data_bytes or 0
        self.data_requests += attempt.data_requests or 0
        self.written_bytes += attempt.written_bytes or 0

    def add_salvaged(self, seconds: float, price: Price) -> None:
        """Useful seconds of an attempt already counted (a resumed checkpoint's training)."""
        self.seconds["useful"] += seconds
        self.spot["useful"] += attempt_cost(seconds, price.spot)
        self.on_demand["useful"] += attempt_cost(seconds, price.on_demand)

    def figures(
        self, storage: StoragePrice | None = None, transfer: str = "internet"
    ) -> dict[str, Any]:
        total = sum(self.spot.values())
        total_od = sum(self.on_demand.values())
        decided = self.spot["useful"] + self.spot["waste"]
        useful_od = self.on_demand["useful"]
        discount = 1.0 - total / total_od if total_od > 0 else None
        realized = 1.0 - decided / useful_od if useful_od > 0 else None
        return {
            "attempts": self.attempts,
            "merged": self.merged,
            "worker_seconds": sum(self.seconds.values()),
            "merged_seconds": self.seconds["useful"],
            "waste_seconds": self.seconds["waste"],
            "pending_seconds": self.seconds["pending"],
            "total_usd": total,
            "useful_usd": self.spot["useful"],
            "waste_usd": self.spot["waste"],
            "pending_usd": self.spot["pending"],
            "waste_share": self.spot["waste"] / decided if decided > 0 else None,
            "merged_samples": self.samples,
            "usd_per_merged_sample": total / self.samples if self.samples else None,
            "on_demand_equivalent_usd": total_od,
            "on_demand_merged_usd": useful_od,
            "savings_usd": useful_od - decided,
            "spot_discount": discount,
            "realized_savings": realized,
            "savings_gap_points": (
                100.0 * (discount - realized)
                if discount is not None and realized is not None
                else None
            ),
            "data_bytes": self.data_bytes,
            "data_requests": self.data_requests,
            "written_bytes": self.written_bytes,
            "data_usd": data_cost(self.data_bytes, self.data_requests, storage, transfer),
        }


def cost_summary(
    attempts: Iterable[Attempt],
    prices: PriceTable,
    *,
    until: datetime,
    run_ended: bool,
    instance_type: str = DEFAULT_INSTANCE_TYPE,
    worker_types: Mapping[str, str] | None = None,
    storage: StoragePrice | None = None,
    data_transfer: str = "internet",
) -> dict[str, Any]:
    """The cost figures of ``attempts`` (see the module docstring), no ledger needed.

    Returns the run-wide figures plus ``instance_types`` (per type: prices,
    discount, attempts, seconds, USD) and ``history`` (the same figures per
    epoch). ``until`` ends attempts without ``finished_at``; ``run_ended``
    turns pending states into waste. ``storage`` prices the data the
    attempts read (``data_usd``; None without it) at ``data_transfer``.

    Raises:
        ConfigError: an instance type (default or mapped) has no price.
    """
    for kind in {instance_type, *(worker_types or {}).values()}:
        prices[kind]  # unknown types fail before any arithmetic
    run = _Tally()
    per_epoch: dict[int, _Tally] = defaultdict(_Tally)
    per_type: dict[str, _Tally] = defaultdict(_Tally)
    estimated = 0.0
    attempts = list(attempts)
    salvaged = salvaged_attempts(attempts)
    for a in attempts:
        kind = instance_for(a.worker, instance_type, worker_types, name=a.worker_name)
        price = prices[kind]
        seconds, is_estimate = attempt_seconds(a, until)
        if is_estimate:
            estimated += seconds
        result = outcome(a.state, run_ended)
        # A salvaged attempt's checkpointed training is useful, the rest of it waste.
        kept = min(seconds, useful_training_seconds(a, salvaged)) if result != "useful" else 0.0
        for tally in (run, per_epoch[a.epoch], per_type[kind]):
            tally.add_traffic(a)
            tally.add(result, seconds - kept, price, a.samples)
            if kept:
                tally.add_salvaged(kept, price)
    types = {}
    for kind in sorted(per_type):
        price = prices[kind]
        figures = per_type[kind].figures()
        types[kind] = {
            "provider": price.provider,
            "region": price.region,
            "spot_per_hour": price.spot,
            "on_demand_per_hour": price.on_demand,
            "discount": price.discount,
            **{
                k: figures[k]
                for k in (
                    "attempts",
                    "worker_seconds",
                    "total_usd",
                    "waste_usd",
                    "on_demand_equivalent_usd",
                )
            },
        }
    return {
        **run.figures(storage, data_transfer),
        "data_store": storage.scheme if storage is not None else None,
        "data_transfer": data_transfer,
        "data_prices": (
            {
                "get_per_1000": storage.get_per_1000,
                "transfer_per_gb": storage.transfer_per_gb[data_transfer],
                "as_of": storage.as_of,
                "source": storage.source,
            }
            if storage is not None
            else None
        ),
        "upper_bound_seconds": estimated,
        "instance_types": types,
        "history": [
            {"epoch": e, **per_epoch[e].figures(storage, data_transfer)} for e in sorted(per_epoch)
        ],
    }


def _store_settings(config: str) -> tuple[str | None, str]:
    """The run's store URL and ``cost.data_transfer`` from its recorded config.

    Read leniently: the report of a run recorded by another vcdl version
    (or by hand) still prices its instances.
    """
    try:
        doc = json.loads(config)
        url = doc.get("store", {}).get("url")
        transfer = doc.get("cost", {}).get("data_transfer", "internet")
    except (ValueError, AttributeError):
        return None, "internet"
    return (url if isinstance(url, str) else None), (
        transfer if transfer in TRANSFERS else "internet"
    )


def store_prices(table: PriceTable, store_url: str | None) -> StoragePrice | None:
    """The read prices of the store at ``store_url`` (None: a local or unpriced store)."""
    if not store_url or "://" not in store_url:
        return None
    scheme = store_url.split("://", 1)[0].lower()
    return table.storage.get("s3" if scheme == "s3a" else scheme)


def cost_report(
    ledger: Ledger,
    run: str,
    prices: PriceTable | None = None,
    *,
    instance_type: str = DEFAULT_INSTANCE_TYPE,
    worker_types: Mapping[str, str] | None = None,
    until: datetime | None = None,
    epoch: int | None = None,
    data_transfer: str | None = None,
) -> dict[str, Any]:
    """Cost, waste and savings of run ``run`` from the ledger, as plain data.

    ``prices`` defaults to :func:`load_prices` (vcdl's list prices). Every
    worker is ``instance_type`` unless a glob in ``worker_types`` (worker
    address or Dask name → instance type) matches it. ``until`` (default: the run's
    ``updated_at``) ends attempts the ledger never saw finish; their seconds
    are upper bounds (``upper_bound_seconds``). See the module docstring for
    the definitions. With ``epoch``, of that epoch's attempts only (they
    alone are read). The data the attempts read is priced if the run's store
    is S3, at ``data_transfer`` (default: the run's ``cost.data_transfer``).

    Raises:
        RunNotFound: no such run.
        ConfigError: an instance type has no price.
    """
    table = prices if prices is not None else load_prices()
    row = ledger.get_run(run)
    store_url, transfer = _store_settings(row.config)
    summary = cost_summary(
        ledger.attempts(run, epoch),
        table,
        until=until if until is not None else row.updated_at,
        run_ended=row.state in ENDED_RUN_STATES,
        instance_type=instance_type,
        worker_types=worker_types,
        storage=store_prices(table, store_url),
        data_transfer=data_transfer or transfer,
    )
    return {
        "run": run,
        "state": row.state,
        "currency": table.currency,
        "prices_as_of": table.as_of,
        "prices_source": table.source,
        "prices_files": list(table.files),
        **summary,
    }


def run_cost_report(
    ledger: Ledger,
    run: str,
    cost: CostSection,
    until: datetime | None = None,
    epoch: int | None = None,
) -> dict[str, Any]:
    """:func:`cost_report` with the prices and instance types of a run's ``[cost]`` settings."""
    return cost_report(
        ledger,
        run,
        run_prices(cost),
        instance_type=cost.instance_type,
        worker_types=cost.worker_types,
        until=until,
        epoch=epoch,
        data_transfer=cost.data_transfer,
    )


# --------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------


def _usd(x: float | None) -> str:
    if x is None:
        return "-"
    return f"${x:,.4f}" if abs(x) < 10 else f"${x:,.2f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def format_cost(report: Mapping[str, Any]) -> str:
    """``report`` (from :func:`cost_report`) as a terminal table."""
    r = report
    per_sample = r["usd_per_merged_sample"]
    lines = [
        f"run {r.get('run', '?')} ({r.get('state', '?')}): cost in {r.get('currency', 'USD')}, "
        f"prices as of {r.get('prices_as_of') or '?'} (spot prices move; list prices, "
        "not your bill)",
        f"  attempts {r['attempts']}, merged {r['merged']}, worker time "
        f"{r['worker_seconds'] / 3600:.3f} h"
        + (
            f" (of which {r['upper_bound_seconds']:.0f} s upper-bound estimates)"
            if r["upper_bound_seconds"]
            else ""
        ),
        f"  spot total        {_usd(r['total_usd']):>12}",
        f"  waste             {_usd(r['waste_usd']):>12}  "
        f"({_pct(r['waste_share'])} of decided cost)",
    ]
    if r["pending_usd"]:
        lines.append(
            f"  pending           {_usd(r['pending_usd']):>12}  (not yet merged or wasted)"
        )
    lines += [
        f"  per merged sample {'-' if per_sample is None else f'${per_sample:.3g}':>12}"
        f"  ({r['merged_samples']:,} samples)",
        f"  on-demand, same seconds   {_usd(r['on_demand_equivalent_usd']):>12}  "
        f"-> spot discount {_pct(r['spot_discount'])}",
        f"  on-demand, merged work    {_usd(r['on_demand_merged_usd']):>12}  "
        f"-> realized savings {_pct(r['realized_savings'])} ({_usd(r['savings_usd'])})",
    ]
    if r["savings_gap_points"] is not None:
        lines.append(f"  waste cost {r['savings_gap_points']:.1f} points of the spot discount")
    read = r.get("data_bytes", 0)
    line = f"  data read {read / 1e9:.3f} GB in {r.get('data_requests', 0):,} GETs"
    if r.get("data_usd") is not None:
        p = r["data_prices"]
        line += (
            f": {_usd(r['data_usd'])} from {r['data_store']} (GETs ${p['get_per_1000']}/1000, "
            f"transfer {r['data_transfer']} ${p['transfer_per_gb']}/GB; prices as of "
            f"{p['as_of'] or '?'}; not in the spot total)"
        )
    else:
        line += " (store not priced: no request or transfer cost)"
    lines.append(line + f"; wrote {r.get('written_bytes', 0) / 1e9:.3f} GB")
    lines += [
        "",
        f"  {'instance type':<18} {'spot/h':>8} {'od/h':>8} {'disc':>6} {'att':>5} "
        f"{'hours':>8} {'cost':>11} {'waste':>11}",
    ]
    for kind, t in r["instance_types"].items():
        lines.append(
            f"  {kind:<18} {t['spot_per_hour']:>8.4f} {t['on_demand_per_hour']:>8.4f} "
            f"{_pct(t['discount']):>6} {t['attempts']:>5} {t['worker_seconds'] / 3600:>8.3f} "
            f"{_usd(t['total_usd']):>11} {_usd(t['waste_usd']):>11}"
        )
    lines += [
        "",
        f"  {'epoch':>5} {'att':>5} {'merged':>6} {'hours':>8} {'cost':>11} "
        f"{'waste':>11} {'waste%':>7} {'saved':>7}",
    ]
    for h in r["history"]:
        lines.append(
            f"  {h['epoch']:>5} {h['attempts']:>5} {h['merged']:>6} "
            f"{h['worker_seconds'] / 3600:>8.3f} {_usd(h['total_usd']):>11} "
            f"{_usd(h['waste_usd']):>11} {_pct(h['waste_share']):>7} "
            f"{_pct(h['realized_savings']):>7}"
        )
    return "\n".join(lines)
