"""The run configuration's operational sections: where a run runs, where it keeps its
state, how it rides out faults, what it costs and how it is watched.

This module owns the sections ``cluster``, ``store`` (with ``store.keep``),
``ledger``, ``fault``, ``cost`` and ``metrics`` of :class:`vcdl.config.RunConfig`:
their fields, defaults, bounds, per-field checks and the descriptions the
Prefect form shows. None of them changes what a run learns; that is
:mod:`vcdl.config`'s sections (``run``, ``data``, ``model``, ``train``) and
:mod:`vcdl.merge.settings`'s (``merge``). Import them from :mod:`vcdl.config`,
which composes every section into the one :class:`~vcdl.config.RunConfig`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from vcdl.config_checks import (
    Section,
    no_nul_byte,
    no_url_secrets,
    scheduler_address_problem,
    usable_path,
)
from vcdl.redact import secret_keys

__all__ = [
    "ClusterSection",
    "CostSection",
    "FaultSection",
    "KeepSection",
    "LedgerSection",
    "MetricsSection",
    "StoreSection",
]


class ClusterSection(Section):
    address: str | None = Field(
        None,
        description="Existing Dask scheduler (tcp://host:8786); empty = start a LocalCluster.",
    )
    workers: int = Field(2, ge=1, le=1024, description="LocalCluster worker processes.")
    threads_per_worker: int = Field(
        1,
        ge=1,
        le=256,
        description="Attempts a LocalCluster worker trains at once (it gets one Dask thread "
        "more, so the next task is set up while one trains).",
    )
    memory_limit: str = Field(
        "4GiB",
        description="Memory limit per LocalCluster worker: a size such as 4GiB or 500MB, "
        "0 for none, or auto (the machine's memory shared out).",
    )
    memory_admission: float = Field(
        0.7,
        ge=0,
        le=0.95,
        description="A worker starts an attempt only while its attempts, at their estimated "
        "size (5-9x the model's bytes), fit in this fraction of its Dask memory limit, "
        "below Dask's pause at 0.8; the rest wait their turn. 0 = no check (every training "
        "slot starts at once, and a worker short of memory is paused or restarted by Dask).",
    )
    start_method: Literal["forkserver", "spawn"] = Field(
        "forkserver",
        description="How LocalCluster nannies start and restart workers: forkserver forks "
        "them from a process that has imported torch, Prefect and vcdl once (a killed worker "
        "is back in under a second); spawn starts a fresh interpreter each time (seconds).",
    )
    task_resources: dict[str, float] = Field(
        default_factory=dict,
        description="Dask resources each shard task requests, e.g. {GPU = 1}: it then runs "
        "only on workers started with `dask worker --resources GPU=1`.",
    )

    speeds: list[float] = Field(
        default_factory=list,
        max_length=1024,
        description="Emulated compute speed per worker, each in (0, 1] (e.g. [1, 0.5, 0.25]): "
        "worker i waits after every batch so that it trains at speeds[i] of its own measured "
        "pace. A LocalCluster takes one per worker; on a fleet, worker i is the dask worker "
        "started with --name i. Empty = none emulated. Every output of a run says so.",
    )

    sizing: Literal["even", "throughput"] = Field(
        "even",
        description="How an epoch's rows are cut into its data.shards shards: even (equal "
        "shards, Dask picks each one's worker) or throughput (shard k pinned to worker "
        "k % workers and sized by that worker's samples a second measured in the run's "
        "earlier epochs, so the shards end together; the first epoch is even; a pinned "
        "worker that is gone leaves its shard to another; each result weighs by its size).",
    )

    overlap_epochs: bool = Field(
        False,
        description="Start the next epoch's attempts while the last shards of the current "
        "one finish (its tail: no more shards left than workers), so that fast workers do "
        "not idle at an epoch's end. Their results wait for the current epoch's barrier "
        "before they merge; never more than one epoch ahead. Not with a rule that pins "
        "every shard's base to the epoch's first version (average).",
    )

    @field_validator("speeds")
    @classmethod
    def _speeds(cls, speeds: list[float]) -> list[float]:
        for s in speeds:
            if not 0 < s <= 1:
                raise ValueError(
                    f"{s} is not a speed in (0, 1]: 1 is a worker's own pace, 0.5 half of it"
                )
        return speeds

    @field_validator("address")
    @classmethod
    def _address(cls, address: str | None) -> str | None:
        if address is not None:
            problem = scheduler_address_problem(address)
            if problem:
                raise ValueError(f"is not a Dask scheduler address: {problem}")
        return address

    @field_validator("memory_limit")
    @classmethod
    def _memory_limit(cls, value: str) -> str:
        # Checked here: else a typo fails only when the cluster starts, after the banner.
        if value.strip().lower() == "auto":
            return value
        from dask.utils import parse_bytes

        try:
            size = parse_bytes(value)
        except (ValueError, TypeError, OverflowError):  # "1e400" parses to infinity
            size = -1
        if not 0 <= size <= 2**60:
            raise ValueError("must be a size such as 4GiB or 500MB, 0 for no limit, or auto")
        return value


class KeepSection(Section):
    """Which model versions keep their weights in the store (see docs/configuration.md).

    Always kept, whatever is set here: v0, the head, each epoch's last
    version, the best evaluated version, and every version an attempt in
    flight, a resumable checkpoint or an unmerged result may still read (its
    base). The rest is pruned during the run and by ``vcdl gc``: the ledger
    keeps each pruned version's row (lineage, alpha, staleness, checksum).
    """

    all: bool = Field(
        False,
        description="Keep every version's weights (no pruning): each merge adds a full copy "
        "of the model to the store.",
    )
    every: int = Field(
        0,
        ge=0,
        le=1_000_000_000,
        description="Also keep every Nth version (v0, vN, v2N...); 0 = none besides those "
        "always kept.",
    )
    latest: int = Field(
        0,
        ge=0,
        le=1_000_000_000,
        description="Also keep the newest N versions; 0 = none besides those always kept.",
    )


class StoreSection(Section):
    keep: KeepSection = Field(
        default_factory=KeepSection,
        description="Retention: which versions keep their weights (v0, the head, epoch ends, "
        "the best and what attempts still need are always kept).",
    )
    url: str | None = Field(
        None, description="Weight store: a directory or s3://bucket/prefix; empty = <home>/store."
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description="fsspec options (e.g. endpoint_url); credentials come from the AWS chain.",
    )

    @field_validator("url")
    @classmethod
    def _no_credentials_in_url(cls, url: str | None) -> str | None:
        if url is not None and "://" not in url:
            url = usable_path(url)  # a local directory
        url = no_nul_byte(url, "a directory or s3:// URL")
        return no_url_secrets(url, "use the AWS credential chain (env, profile, role)")

    @field_validator("storage_options")
    @classmethod
    def _no_secrets(cls, options: dict[str, Any]) -> dict[str, Any]:
        found = secret_keys(options)
        if found:
            raise ValueError(
                f"must not hold credentials ({', '.join(found)}): the config is recorded in the "
                "ledger and shown in Prefect; use the AWS credential chain (env, profile, role)"
            )
        return options


class LedgerSection(Section):
    url: str | None = Field(
        None,
        description="SQLAlchemy URL (sqlite:///…, postgresql+psycopg://…); "
        "empty = sqlite under <home>. No password: use PGPASSWORD or ~/.pgpass.",
    )

    @field_validator("url")
    @classmethod
    def _supported_without_password(cls, url: str | None) -> str | None:
        url = no_url_secrets(no_nul_byte(url, "a URL"), "set PGPASSWORD or use ~/.pgpass")
        backend = url.split("://", 1)[0].split("+", 1)[0] if url and "://" in url else None
        if url and backend not in ("sqlite", "postgresql"):
            # Checked here, before anything starts, not when the ledger is opened.
            raise ValueError(
                "must be sqlite:///path/ledger.db or postgresql+psycopg://user@host:5432/db "
                "(vcdl's ledger runs on SQLite and PostgreSQL only)"
            )
        return url


class FaultSection(Section):
    max_attempts: int = Field(
        4,
        ge=1,
        le=100,
        description="Attempts per subtask before it is recorded as failed. Not counted: a "
        "killed attempt that checkpointed further than any before it, and a task a worker "
        "under preemption notice handed back untrained (vcdl/driver/budget.py).",
    )
    attempt_timeout: float = Field(
        900.0,
        gt=0,
        le=7 * 86400,
        description="Seconds after which a running attempt is presumed dead. An epoch that "
        "gets no result for a quarter of this logs what it waits for: each task's state in "
        "Dask, its attempts, its call stack on its worker.",
    )
    checkpoint_seconds: float = Field(
        60.0,
        ge=0,
        le=86400,
        description="Write a running attempt's weights every this many seconds of training, so "
        "the attempt that replaces it after a kill resumes there instead of starting over "
        "(0: never). The least interval: see checkpoint_write_ratio.",
    )
    checkpoint_write_ratio: float = Field(
        10.0,
        ge=1,
        le=1000,
        description="Train at least this many times as long as the last checkpoint write took "
        "before writing the next: a big model on a slow store checkpoints less often than "
        "checkpoint_seconds, so writes cost at most ~1/ratio of the training.",
    )
    cloud_notices: Literal["off", "aws", "gcp", "azure"] = Field(
        "off",
        description="Poll this cloud's instance metadata service for spot preemption notices "
        "on every worker (a VM fleet: nothing sends SIGTERM there); a notice does what "
        "SIGTERM does: finish the batch, hand in a partial result, take no new work.",
    )
    notice_poll_seconds: float = Field(
        5.0,
        ge=0.1,
        le=60,
        description="Seconds between two polls of the metadata service (cloud_notices).",
    )
    partial: Literal["scale", "discard"] = Field(
        "scale",
        description="A partial result (preemption notice): merge it scaled by the fraction of "
        "its shard it processed, or discard it and reissue the subtask.",
    )
    quorum: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Fraction of an epoch's shards that must be merged before stragglers "
        "may be left behind (1 = wait for all).",
    )
    straggler_timeout: float = Field(
        60.0,
        gt=0,
        le=7 * 86400,
        description="Seconds to wait for stragglers once the quorum is merged.",
    )
    late: Literal["reissue", "drop"] = Field(
        "reissue",
        description="Shards still unmerged at the straggler deadline: reissue them in the "
        "next epoch, or drop them (recorded either way).",
    )


class CostSection(Section):
    instance_type: str = Field(
        "g4dn.xlarge",
        description="Instance type of the workers, for cost accounting (a key of the price "
        "table: vcdl/views/prices.toml or cost.prices).",
    )
    prices: str | None = Field(
        None,
        description="TOML file of instance prices overriding vcdl's dated list prices "
        '([instance."TYPE"] on_demand = ..., spot = ...).',
    )

    @field_validator("prices")
    @classmethod
    def _prices(cls, value: str | None) -> str | None:
        return usable_path(value)

    worker_types: dict[str, str] = Field(
        default_factory=dict,
        description="Worker address or Dask name glob -> instance type, for fleets of several "
        'types (e.g. {"gpu-*" = "g5.xlarge"}).',
    )
    data_transfer: Literal["same_region", "cross_region", "internet"] = Field(
        "internet",
        description="Where the workers are relative to an S3 store's bucket, for pricing the "
        "training data they read (vcdl cost): same_region (EC2 in the bucket's region: "
        "transfer free), cross_region, internet (another cloud or on premises; the default, "
        "the dearest).",
    )


class MetricsSection(Section):
    port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Port of the driver's Prometheus endpoint (/metrics); empty = none. "
        "Not part of what the run is: `vcdl resume --metrics-port` may change it.",
    )
    address: str = Field(
        "127.0.0.1",
        description="Address the metrics endpoint listens on (0.0.0.0: every interface).",
        max_length=255,
    )
    linger: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="Seconds the endpoint may stay up after the run ends, until one scrape "
        "has read the final figures (set it above Prometheus' scrape interval).",
    )
