"""Initial schema: run, subtask, attempt, version, evaluation.

Exactly what ``SQLModel.metadata.create_all`` made before vcdl had migrations
(commit ae55899), so a ledger from that time is stamped at this revision
instead of being re-created.

Revision ID: 0001
Revises:
Create Date: 2026-11-21

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "run",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("config", sa.Text(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("head_version", sa.Integer(), nullable=False),
        sa.Column("epochs_completed", sa.Integer(), nullable=False),
        sa.Column("parent_run", sa.String(), nullable=True),
        sa.Column("parent_version", sa.Integer(), nullable=True),
        sa.Column("lease_owner", sa.String(), nullable=True),
        sa.Column("lease_expires", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "subtask",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run", sa.String(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("merged_version", sa.Integer(), nullable=True),
        sa.Column("reason", sa.String(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run", "epoch", "shard", name="uq_subtask_run_epoch_shard"),
        sa.ForeignKeyConstraint(["run"], ["run.name"]),
    )
    op.create_index("ix_subtask_run", "subtask", ["run"], unique=False)
    op.create_table(
        "evaluation",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run", sa.String(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=True),
        sa.Column("split", sa.String(), nullable=False),
        sa.Column("accuracy", sa.Float(), nullable=False),
        sa.Column("loss", sa.Float(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.ForeignKeyConstraint(["run"], ["run.name"]),
    )
    op.create_index("ix_evaluation_run", "evaluation", ["run"], unique=False)
    op.create_table(
        "attempt",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("run", sa.String(), nullable=False),
        sa.Column("subtask_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(), nullable=False),
        sa.Column("base_version", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("result_uri", sa.String(), nullable=True),
        sa.Column("samples", sa.Integer(), nullable=True),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("train_seconds", sa.Float(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reason", sa.String(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("subtask_id", "number", name="uq_attempt_subtask_number"),
        sa.ForeignKeyConstraint(["run"], ["run.name"]),
        sa.ForeignKeyConstraint(["subtask_id"], ["subtask.id"]),
    )
    op.create_index("ix_attempt_run", "attempt", ["run"], unique=False)
    op.create_table(
        "version",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run", sa.String(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("parent", sa.Integer(), nullable=True),
        sa.Column("subtask_id", sa.Integer(), nullable=True),
        sa.Column("attempt_id", sa.String(), nullable=True),
        sa.Column("epoch", sa.Integer(), nullable=True),
        sa.Column("alpha", sa.Float(), nullable=True),
        sa.Column("staleness", sa.Integer(), nullable=True),
        sa.Column("uri", sa.String(), nullable=False),
        sa.Column("checksum", sa.String(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run", "number", name="uq_version_run_number"),
        # The at-most-once merge (docs/design.md §1.4).
        sa.UniqueConstraint("run", "subtask_id", name="uq_version_run_subtask"),
        sa.ForeignKeyConstraint(["run"], ["run.name"]),
        sa.ForeignKeyConstraint(["subtask_id"], ["subtask.id"]),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempt.id"]),
    )


def downgrade() -> None:
    op.drop_index("ix_evaluation_run", table_name="evaluation")
    op.drop_table("evaluation")
    op.drop_table("version")
    op.drop_index("ix_attempt_run", table_name="attempt")
    op.drop_table("attempt")
    op.drop_index("ix_subtask_run", table_name="subtask")
    op.drop_table("subtask")
    op.drop_table("run")
