"""The run configuration: one frozen, validated model, loaded from TOML.

This module owns the schema of a run (sections run, data, model, train, merge,
cluster, store, ledger, fault, cost, metrics), its defaults, validation and the one-line
error messages for bad input; the merge section is :mod:`vcdl.merge.settings`'s,
composed from the merge rules' own settings. The same :class:`RunConfig` is the Prefect
``train`` flow's parameter schema, so the Prefect UI renders a form from the
field descriptions below.

Locations (``store.url``, ``ledger.url``) may be left empty: they then resolve
under the vcdl home directory (``--home``, ``$VCDL_HOME`` or ``./.vcdl``),
see :func:`vcdl.config_files.resolve_home` and :meth:`RunConfig.with_locations`.

Long on purpose: one class per config section, with the field descriptions
the Prefect form shows; they are the schema's one home.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from vcdl.config_checks import (
    NumbersAreNumbers,
    no_nul_byte,
    no_url_secrets,
    scheduler_address_problem,
    usable_path,
)
from vcdl.errors import ConfigError
from vcdl.merge.settings import MergeSection
from vcdl.redact import secret_keys

# "package.module:attr.attr": what an import path of the user's code looks like.
_IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


class _Section(NumbersAreNumbers):
    # extra="forbid": a misspelt key must fail loudly, not be ignored. No float
    # may be NaN or infinite: every number of a run is a finite amount.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RunSection(_Section):
    name: str | None = Field(
        None,
        description="Run name in the ledger; empty = derived from the config file name.",
        pattern=r"^[A-Za-z0-9_.-]+$",
        max_length=100,
    )
    seed: int = Field(
        0, ge=0, le=2**32 - 1, description="Seed for model init, shard plans and training."
    )
    epochs: int = Field(5, ge=1, le=100_000, description="Epochs to train.")
    code_dir: str | None = Field(
        None,
        description="Where the run's own modules (model factory, objective given by import "
        "path) are found besides the current directory; set to the config file's directory "
        "when a config is loaded from a file. They are imported by the driver and shipped "
        "to every Dask worker.",
    )

    @field_validator("code_dir")
    @classmethod
    def _code_dir(cls, value: str | None) -> str | None:
        return usable_path(value)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        # A run's name is a path component of the store and the log: not "." or "..",
        # nor a "__" name, which Zarr keeps for itself.
        if value is not None and (set(value) == {"."} or value.startswith("__")):
            raise ValueError(f"{value!r} cannot name a run: not only dots, not starting with '__'")
        return value


# A data set's field, or an objective's input: [data] fields maps one onto the other.
_FieldName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


class DataSection(_Section):
    name: str = Field(
        "mnist1d",
        description="Data set in the store (see `vcdl data list`). The built-in sets "
        "'digits' and 'mnist1d' are generated on first use.",
        pattern=r"^[A-Za-z0-9_.-]+$",
        max_length=100,
    )
    shards: int = Field(8, ge=1, le=100_000, description="Shards (subtasks) per epoch.")
    samples: int | None = Field(
        None,
        ge=100,
        le=10_000_000,
        description="Samples to generate for a built-in generated set (mnist1d).",
    )
    eval_batch_size: int = Field(1000, ge=1, le=1_000_000, description="Batch size for evaluation.")
    fields: dict[_FieldName, _FieldName] = Field(
        default_factory=dict,
        description="A built-in objective's inputs mapped onto the data set's own field names, "
        "e.g. { x = 'features', y = 'target' }; an input not named here is read under its own "
        "name (classification and regression read x and y, causal_lm reads tokens).",
    )
    cache_mb: int = Field(
        256,
        ge=0,
        description="A training split up to this size (decoded) is kept in each worker "
        "process's memory after its first shard, so later shards are indexed in memory "
        "instead of decoding every chunk their rows are scattered over; 0 = never. A larger "
        "split is streamed from the store block by block (chunk by chunk) with read-ahead, "
        "never held whole.",
    )
    plan: Literal["rows", "blocks"] = Field(
        "blocks",
        description="Shard plan. blocks: each epoch orders the split's stored chunks afresh and "
        "the rows within each, and cuts that sequence into shards, so an attempt reads about "
        "its own share of the split. rows: a fresh permutation of all rows per epoch (every "
        "shard's rows lie in every chunk; an attempt beyond cache_mb reads the whole split).",
    )


class ModelSection(_Section):
    factory: str = Field(
        "cnn1d",
        description="Built-in model (mlp, cnn1d, cnn2d, resnet, gpt) or 'package.module:function'.",
        min_length=1,
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the factory."
    )


class TrainSection(_Section):
    local_epochs: int = Field(1, ge=1, le=1000, description="Passes over its shard per attempt.")
    batch_size: int = Field(
        100,
        ge=1,
        description="Mini-batch size per worker (the fleet steps on batch_size x workers).",
    )
    optimizer: Literal["sgd", "adam", "adamw"] = Field("adam", description="Local optimizer.")
    optimizer_state: Literal["fresh", "worker"] = Field(
        "fresh",
        description="fresh: every attempt builds its optimizer anew. worker: a worker keeps "
        "its optimizer's state (Adam's moments, SGD's momentum) from its previous attempt of "
        "the run in memory and the next attempt continues from it; a new or restarted worker "
        "starts fresh. The merge and the ledger see weights only.",
    )
    lr: float = Field(3e-3, gt=0, le=10, description="Learning rate of the local optimizer.")
    momentum: float = Field(0.0, ge=0, lt=1, description="SGD momentum.")
    weight_decay: float = Field(0.0, ge=0, le=10, description="Weight decay.")
    threads: int = Field(1, ge=1, le=256, description="torch threads per attempt.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where an attempt trains: auto = CUDA when the worker has it."
    )
    amp: bool = Field(
        False, description="Mixed precision (bfloat16 autocast) on CUDA; ignored on CPU."
    )
    objective: str = Field(
        "classification",
        description="What the model is trained for: classification (cross-entropy on x, y; "
        "accuracy), regression (mean squared error on x, y), causal_lm (next-token "
        "cross-entropy on tokens; perplexity, token accuracy), or an import path "
        "'package.module:function' taking (model, batch) and returning the loss.",
        min_length=1,
    )
    metrics: str | None = Field(
        None,
        description="With an objective given by import path: 'package.module:function' "
        "taking (model, batch) and returning a dict of per-batch metric means for evaluation.",
    )

    @field_validator("objective")
    @classmethod
    def _objective_name(cls, value: str) -> str:
        builtins = ("classification", "regression", "causal_lm")
        if value not in builtins and not _IMPORT_PATH.fullmatch(value):
            raise ValueError(
                f"must be one of {', '.join(builtins)} or an import path 'package.module:function'"
            )
        return value

    @field_validator("metrics")
    @classmethod
    def _metrics_path(cls, value: str | None) -> str | None:
        if value is not None and not _IMPORT_PATH.fullmatch(value):
            raise ValueError("must be an import path 'package.module:function'")
        return value


class ClusterSection(_Section):
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


class KeepSection(_Section):
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


class StoreSection(_Section):
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


class LedgerSection(_Section):
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


class FaultSection(_Section):
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
        description="Seconds after which a running attempt is presumed dead.",
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


class CostSection(_Section):
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
        description="Worker address glob -> instance type, for fleets of several types.",
    )
    data_transfer: Literal["same_region", "cross_region", "internet"] = Field(
        "internet",
        description="Where the workers are relative to an S3 store's bucket, for pricing the "
        "training data they read (vcdl cost): same_region (EC2 in the bucket's region: "
        "transfer free), cross_region, internet (another cloud or on premises; the default, "
        "the dearest).",
    )


class MetricsSection(_Section):
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


class RunConfig(_Section):
    """Everything that defines a training run."""

    run: RunSection = Field(default_factory=RunSection)
    data: DataSection = Field(default_factory=DataSection)
    model: ModelSection = Field(default_factory=ModelSection)
    train: TrainSection = Field(default_factory=TrainSection)
    merge: MergeSection = Field(default_factory=MergeSection)
    cluster: ClusterSection = Field(default_factory=ClusterSection)
    store: StoreSection = Field(default_factory=StoreSection)
    ledger: LedgerSection = Field(default_factory=LedgerSection)
    fault: FaultSection = Field(default_factory=FaultSection)
    cost: CostSection = Field(default_factory=CostSection)
    metrics: MetricsSection = Field(default_factory=MetricsSection)

    @model_validator(mode="after")
    def _check_speeds(self) -> RunConfig:
        speeds = self.cluster.speeds
        if speeds and not self.cluster.address and len(speeds) != self.cluster.workers:
            raise ValueError(
                f"cluster.speeds lists {len(speeds)} speed(s) for {self.cluster.workers} local "
                f"worker(s): give one per worker, or set cluster.workers = {len(speeds)}"
            )
        return self

    @model_validator(mode="after")
    def _check_fold(self) -> RunConfig:
        if self.merge.fold > 1 and self.store.keep.all:
            raise ValueError(
                "merge.fold above 1 writes only the last of the results it folds, but "
                "store.keep.all asks to keep every version's weights: set merge.fold = 1, "
                "or keep fewer versions (store.keep.every / store.keep.latest)"
            )
        return self

    def with_locations(self, home: str | Path) -> RunConfig:
        """Fill empty store/ledger URLs with the defaults under ``home``."""
        home = Path(home).resolve()
        store = self.store
        ledger = self.ledger
        if not store.url:
            store = store.model_copy(update={"url": str(home / "store")})
        if not ledger.url:
            ledger = ledger.model_copy(update={"url": f"sqlite:///{home / 'ledger.db'}"})
        return self.model_copy(update={"store": store, "ledger": ledger})

    @property
    def global_batch_size(self) -> int:
        """Samples the whole fleet steps on per round of steps: every worker's batch together."""
        return self.train.batch_size * self.cluster.workers

    def updated(self, **sections: Mapping[str, Any]) -> RunConfig:
        """A validated copy with some keys of some sections replaced."""
        data = self.model_dump()
        for section, values in sections.items():
            data.setdefault(section, {}).update(values)
        return parse_config(data)


def format_error(exc: ValidationError) -> str:
    """One line per problem, naming the key and what is allowed."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if not isinstance(p, int)) or "config"
        kind = err["type"]
        if kind == "extra_forbidden":
            section_key = loc.rsplit(".", 1)
            allowed = _allowed_keys(section_key[0] if len(section_key) == 2 else "")
            parts.append(f"{loc}: unknown key (allowed: {', '.join(allowed)})")
            continue
        msg = err["msg"].removeprefix("Value error, ")
        got = err.get("input")
        # Never echo URLs or storage options back: they may hold secrets.
        sensitive = any(w in loc for w in ("url", "storage_options", "address"))
        if kind not in ("missing",) and not isinstance(got, dict) and not sensitive:
            shown = repr(got)
            # A long value (a pasted file, a name of thousands of characters) is cut:
            # the message stays one readable line.
            msg = f"{msg} (got {shown if len(shown) <= 80 else shown[:77] + '...'})"
        parts.append(f"{loc}: {msg}" if not msg.startswith(loc) else msg)
    return "; ".join(parts)


def _allowed_keys(section: str) -> list[str]:
    # A dotted section (store.keep) is walked down from the top.
    model: Any = RunConfig
    for part in section.split(".") if section else []:
        field = model.model_fields.get(part)
        inner = field.annotation if field is not None else None
        if not (isinstance(inner, type) and issubclass(inner, BaseModel)):
            return list(RunConfig.model_fields)
        model = inner
    return list(model.model_fields)


def parse_config(data: Mapping[str, Any]) -> RunConfig:
    """Validate a mapping (as read from TOML) into a :class:`RunConfig`."""
    try:
        return RunConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(f"invalid config: {format_error(exc)}") from None
