"""Add the decision table: the driver's decisions about a subtask its attempts cannot show.

One small row per decision, written by the epoch's executor on the fault
path only (``vcdl story``, vcdl/views/story.py): a task a worker under a
preemption notice handed back before claiming an attempt (``handed_back``,
with the worker), a reissue and its reason (``reissue``), a subtask closed
as failed, dropped or deferred, and why (``closed``). At most
``DECISIONS_PER_SUBTASK`` per subtask. A new table, no backfill: a run
recorded before has none, and its story is told from its attempts alone.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29 09:48:36

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "decision",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run", sa.String(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("worker", sa.String(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run"], ["run.name"]),
        sa.PrimaryKeyConstraint("id"),
    )
    # A subtask's decisions are read and counted (the bound) by run, epoch and shard.
    op.create_index(
        "ix_decision_run_epoch_shard", "decision", ["run", "epoch", "shard"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_decision_run_epoch_shard", table_name="decision")
    op.drop_table("decision")
