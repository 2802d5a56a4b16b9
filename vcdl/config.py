"""The run configuration: one frozen, validated model, loaded from TOML.

This module owns the schema of a run (sections run, data, model, train, merge,
cluster, store, ledger, fault, cost, metrics), its defaults, validation and the one-line
error messages for bad input. It defines what a run learns (sections run, data, model,
train) and composes the rest: the merge section is :mod:`vcdl.merge.settings`'s,
composed from the merge rules' own settings; cluster, store, ledger, fault, cost and
metrics (where a run runs and how it is kept, watched and billed) are
:mod:`vcdl.config_ops`'s, re-exported here. The same :class:`RunConfig` is the Prefect
``train`` flow's parameter schema, so the Prefect UI renders a form from the
field descriptions of the sections.

Locations (``store.url``, ``ledger.url``) may be left empty: they then resolve
under the vcdl home directory (``--home``, ``$VCDL_HOME`` or ``./.vcdl``),
see :func:`vcdl.config_files.resolve_home` and :meth:`RunConfig.with_locations`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from vcdl.config_checks import Section, scheduler_address_problem, usable_path
from vcdl.config_ops import (
    ClusterSection,
    CostSection,
    FaultSection,
    KeepSection,
    LedgerSection,
    MetricsSection,
    StoreSection,
)
from vcdl.errors import ConfigError
from vcdl.merge.settings import MergeSection

__all__ = [
    "ClusterSection",
    "CostSection",
    "DataSection",
    "FaultSection",
    "KeepSection",
    "LedgerSection",
    "MergeSection",
    "MetricsSection",
    "ModelSection",
    "RunConfig",
    "RunSection",
    "StoreSection",
    "TrainSection",
    "format_error",
    "parse_config",
    "scheduler_address_problem",  # vcdl.config_checks', imported from here by callers
]

# "package.module:attr.attr": what an import path of the user's code looks like.
_IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


class RunSection(Section):
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


class DataSection(Section):
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


class ModelSection(Section):
    factory: str = Field(
        "cnn1d",
        description="Built-in model (mlp, cnn1d, cnn2d, resnet, gpt) or 'package.module:function'.",
        min_length=1,
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the factory."
    )


class TrainSection(Section):
    local_epochs: int = Field(1, ge=1, le=1000, description="Passes over its shard per attempt.")
    batch_size: int = Field(
        100,
        ge=1,
        description="Mini-batch size per worker (the fleet steps on batch_size x workers).",
    )
    optimizer: Literal["sgd", "adam", "adamw"] = Field("adam", description="Local optimizer.")
    # "worker" by measurement: the only setting within 1 point / 1 % of one
    # process on the four untuned jobs of benchmarks/defaults.py
    # (docs/configuration.md, "The defaults on jobs nobody tuned").
    optimizer_state: Literal["fresh", "worker"] = Field(
        "worker",
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


class RunConfig(Section):
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
    def _check_overlap(self) -> RunConfig:
        from vcdl.merge.rules import RULES  # the registry imports this module's sections

        rule = RULES.get(self.merge.rule)
        if self.cluster.overlap_epochs and rule is not None and rule.pins_base:
            raise ValueError(
                f"cluster.overlap_epochs starts an epoch's attempts before the previous "
                f"epoch's barrier, but merge.rule = {self.merge.rule!r} starts every shard "
                "of an epoch from the version at that barrier: set cluster.overlap_epochs = "
                "false, or use a rule that trains from the head (vc_asgd, delta, diloco, ...)"
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
