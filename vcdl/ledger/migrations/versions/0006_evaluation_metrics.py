"""Evaluations record the objective's metrics: accuracy only where there is one.

``evaluation.metrics``: a JSON object of every metric the run's objective
reports (loss, accuracy, perplexity, token accuracy, the user's own).
``evaluation.accuracy`` becomes nullable: a regression or a language model
has none. No backfill: older rows' metrics are their loss and accuracy.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 02:00:00

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _evaluation_0005() -> sa.Table:
    """The table as revisions 0001-0005 made it: SQLite's batch mode copies it from this
    (so ``--sql`` works without a live database to reflect)."""
    return sa.Table(
        "evaluation",
        sa.MetaData(),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run", sa.String(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=True),
        sa.Column("split", sa.String(), nullable=False),
        sa.Column("accuracy", sa.Float(), nullable=False),
        sa.Column("loss", sa.Float(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run"], ["run.name"]),
        sa.PrimaryKeyConstraint("id"),
        sa.Index("ix_evaluation_run", "run"),
    )


def upgrade() -> None:
    with op.batch_alter_table("evaluation", schema=None, copy_from=_evaluation_0005()) as batch_op:
        batch_op.alter_column("accuracy", existing_type=sa.Float(), nullable=True)
        batch_op.add_column(sa.Column("metrics", sa.Text(), nullable=True))


def downgrade() -> None:
    op.execute("UPDATE evaluation SET accuracy = 0 WHERE accuracy IS NULL")
    with op.batch_alter_table("evaluation", schema=None) as batch_op:
        batch_op.drop_column("metrics")
        batch_op.alter_column("accuracy", existing_type=sa.Float(), nullable=False)
