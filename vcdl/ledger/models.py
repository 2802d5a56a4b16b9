"""The ledger's tables: runs, subtasks, attempts, versions, evaluations, the driver's decisions.

This module owns the schema only (SQLModel ``table=True`` classes, their
constraints and the UTC timestamp column type); the queries live in
:mod:`vcdl.ledger`. Table and column names are a contract: flows, the CLI and
reports are written against them.

The at-most-once merge of docs/design.md §1.4 is the unique constraint
``uq_version_run_subtask`` on ``version(run, subtask_id)``: a second version for
the same subtask cannot exist, whatever the code above it does. Version 0 and
other non-subtask versions have a NULL ``subtask_id``; NULLs never collide in a
unique constraint on SQLite or PostgreSQL, so any number of them is allowed.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

from sqlalchemy import BigInteger, DateTime, Dialect, Index, Text, UniqueConstraint
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel


def utcnow() -> datetime:
    """The current time, tz-aware UTC (the only kind of time the ledger stores)."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored as UTC and always returned tz-aware UTC.

    PostgreSQL keeps it as ``timestamptz``. SQLite has no time zones: SQLAlchemy's
    SQLite ``DateTime`` would silently drop ``tzinfo``, so an aware local time
    would be stored as if it were UTC. Converting to naive UTC on the way in and
    tagging UTC on the way out keeps both backends identical, and keeps the
    string form sortable so lease expiry can be compared inside SQL.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        # Naive values are taken to be UTC already (that is what utcnow() gives
        # without tzinfo); aware values are converted.
        aware = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return aware.replace(tzinfo=None) if dialect.name == "sqlite" else aware

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Run(SQLModel, table=True):
    """One training run: its config, state, head version and driver lease."""

    __tablename__ = "run"

    name: str = Field(primary_key=True)
    config: str = Field(sa_type=Text)  # JSON text of the run configuration
    state: str = "created"
    head_version: int = 0
    epochs_completed: int = 0
    parent_run: str | None = None  # warm start: the run and version v0 was copied from
    parent_version: int | None = None
    lease_owner: str | None = None  # the driver process currently advancing this run
    lease_expires: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # The fencing token: raised by one each time a driver takes the lease
    # from another (or from nobody); a write carrying an older one is refused.
    lease_generation: int = Field(
        default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": "0"}
    )
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Subtask(SQLModel, table=True):
    """One (run, epoch, shard): merged at most once, however many attempts it has."""

    __tablename__ = "subtask"
    __table_args__ = (UniqueConstraint("run", "epoch", "shard", name="uq_subtask_run_epoch_shard"),)

    id: int | None = Field(default=None, primary_key=True)
    run: str = Field(foreign_key="run.name", index=True)
    epoch: int
    shard: int
    state: str = "pending"
    attempts: int = 0
    merged_version: int | None = None
    reason: str | None = None
    # The throughput plan (cluster.sizing = "throughput", vcdl/data/sizing.py):
    # the shard's training rows and the worker it is pinned to (its name, from
    # 0014 on; an address before, and for a worker Dask named by its address).
    # NULL: the even plan (every subtask of a run before 0013, and of an "even" run).
    rows: int | None = None
    worker: str | None = None


class Attempt(SQLModel, table=True):
    """One execution of a subtask on one worker, from its base version to its result."""

    __tablename__ = "attempt"
    # Numbers are handed out under the subtask's row lock; the constraint makes
    # a numbering bug loud instead of silent.
    __table_args__ = (UniqueConstraint("subtask_id", "number", name="uq_attempt_subtask_number"),)

    id: str = Field(default_factory=lambda: uuid4().hex, primary_key=True)
    run: str = Field(foreign_key="run.name", index=True)
    subtask_id: int = Field(foreign_key="subtask.id")
    epoch: int
    shard: int
    number: int  # 1-based per subtask
    worker: str
    base_version: int
    state: str = "running"
    result_uri: str | None = None
    samples: int | None = None
    loss: float | None = None
    train_seconds: float | None = None
    started_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    deadline: datetime | None = Field(default=None, sa_type=UTCDateTime)
    reason: str | None = None
    # JSON object of seconds per phase of the attempt's life (claim, read,
    # data, train, write, record on the worker; read_result, read_head, merge,
    # write_version, ledger in the assimilator; queued, scheduling and prefect
    # measured by the driver): where the overhead goes (benchmarks/overhead.py,
    # vcdl status).
    timings: str | None = None
    # The newest durable checkpoint of the attempt's training so far (samples
    # and train_seconds are updated with it): where a replacement resumes if
    # this attempt dies. Cleared once a result supersedes it.
    checkpoint_uri: str | None = None
    # The attempt whose checkpoint this one started from, if any, and that
    # checkpoint's train_seconds when it was read: the source's training this
    # attempt salvaged (the source may have lived on and recorded more).
    resumed_from: str | None = None
    resumed_seconds: float | None = None
    # Bytes of training data the attempt fetched from the store, and bytes of
    # tensors it wrote there (result and checkpoints): what an object store
    # bills as transfer (vcdl cost). NULL for attempts recorded before.
    data_bytes: int | None = Field(default=None, sa_type=BigInteger)
    data_requests: int | None = None  # the GETs that fetched data_bytes
    written_bytes: int | None = Field(default=None, sa_type=BigInteger)
    # JSON object of what re-training this attempt needs besides the run's
    # config (seed, resumed samples, the attempts whose optimizer state or
    # EASGD variable it continued, device): vcdl.replay. NULL before 0011.
    replay_inputs: str | None = Field(default=None, sa_type=Text)
    # The Dask worker's name (``worker`` is its address): what outlives a restart
    # on a new address, so the throughput plan measures and pins by it. NULL
    # before 0014 (vcdl.driver.throughput falls back to the address).
    worker_name: str | None = None


FOLDED_CHECKSUM = "folded"
"""The checksum of a version folded into a later one (``merge.fold``): its weights were never
stored, so it is recorded as pruned from the moment it was made, under this checksum, which
no stored group has (anything that would verify bytes against it fails)."""


class Version(SQLModel, table=True):
    """An immutable global model version and its lineage."""

    __tablename__ = "version"
    __table_args__ = (
        UniqueConstraint("run", "number", name="uq_version_run_number"),
        # THE at-most-once merge guarantee (docs/design.md §1.4).
        UniqueConstraint("run", "subtask_id", name="uq_version_run_subtask"),
    )

    id: int | None = Field(default=None, primary_key=True)
    run: str = Field(foreign_key="run.name")
    number: int
    parent: int | None = None
    subtask_id: int | None = Field(default=None, foreign_key="subtask.id")
    attempt_id: str | None = Field(default=None, foreign_key="attempt.id")
    epoch: int | None = None
    alpha: float | None = None
    staleness: int | None = None
    uri: str
    checksum: str
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    # When the retention policy (store.keep) let the version's weights go:
    # from then on nothing reads its group (export and evaluate refuse it),
    # its row stays as lineage. Set *before* the bytes are deleted, so a kill
    # in between leaves leftover bytes (deleted by the next `vcdl gc`), never
    # a version the ledger offers whose bytes are gone.
    pruned_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class Evaluation(SQLModel, table=True):
    """The objective's metrics of one version on one data split (see vcdl.objectives)."""

    __tablename__ = "evaluation"

    id: int | None = Field(default=None, primary_key=True)
    run: str = Field(foreign_key="run.name", index=True)
    version: int
    epoch: int | None = None
    split: str
    accuracy: float | None = None  # classification only
    loss: float | None  # None: NaN (SQLite stores NaN as NULL); ``metrics`` keeps the NaN
    samples: int
    # JSON object of every metric the objective reports (loss, accuracy,
    # perplexity, token_accuracy, rmse, the user's own); None for rows
    # recorded before objectives, whose metrics are loss and accuracy.
    metrics: str | None = Field(default=None, sa_type=Text)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


DECISIONS_PER_SUBTASK = 50
"""Decisions the ledger keeps of one subtask (the first ones): a subtask's reissues are bounded
by ``fault.max_attempts`` and its free hand-backs by ``FREE_HANDBACKS`` (20), so only a
pathological history reaches this."""


class Decision(SQLModel, table=True):
    """A decision of the driver about a subtask that its attempt rows cannot show.

    Written by the epoch's executor on the fault path only (``vcdl story``
    tells them): ``handed_back`` (a worker under a preemption notice handed
    the task back before claiming an attempt; ``worker`` is that worker),
    ``reissue`` (the subtask's task was submitted again; ``detail`` is why)
    and ``closed`` (failed, dropped or deferred, and why: the subtask's row
    keeps no time, and a deferred subtask's state is overwritten once a
    later epoch trains it). At most :data:`DECISIONS_PER_SUBTASK` per
    subtask. Nothing else reads them: a replay and ``vcdl audit`` go by the
    attempts and versions.
    """

    __tablename__ = "decision"
    __table_args__ = (Index("ix_decision_run_epoch_shard", "run", "epoch", "shard"),)

    id: int | None = Field(default=None, primary_key=True)
    run: str = Field(foreign_key="run.name")
    epoch: int
    shard: int
    kind: str
    worker: str | None = None
    detail: str = Field(default="", sa_type=Text)
    at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
