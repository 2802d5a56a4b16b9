"""An evaluation's loss may be NaN: the column becomes nullable.

A diverged model evaluates to a NaN loss. SQLite stores NaN as NULL, so the
NOT NULL column refused the row and the evaluation killed the run. Now the
``loss`` column holds NULL for NaN, and ``evaluation.metrics`` (JSON) keeps
the NaN itself: the evaluation is recorded as it was, never fatal.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28 18:30:00

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _evaluation_0009() -> sa.Table:
    """The table as revisions 0006-0009 left it: SQLite's batch mode copies it from this
    (so ``--sql`` works without a live database to reflect)."""
    return sa.Table(
        "evaluation",
        sa.MetaData(),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run", sa.String(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=True),
        sa.Column("split", sa.String(), nullable=False),
        sa.Column("accuracy", sa.Float(), nullable=True),
        sa.Column("loss", sa.Float(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("metrics", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["run"], ["run.name"]),
        sa.PrimaryKeyConstraint("id"),
        sa.Index("ix_evaluation_run", "run"),
    )


def upgrade() -> None:
    with op.batch_alter_table("evaluation", schema=None, copy_from=_evaluation_0009()) as batch_op:
        batch_op.alter_column("loss", existing_type=sa.Float(), nullable=True)


def downgrade() -> None:
    op.execute("UPDATE evaluation SET loss = 'Infinity' WHERE loss IS NULL")
    with op.batch_alter_table("evaluation", schema=None) as batch_op:
        batch_op.alter_column("loss", existing_type=sa.Float(), nullable=False)
