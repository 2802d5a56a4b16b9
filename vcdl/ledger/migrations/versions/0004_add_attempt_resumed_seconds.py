"""Add attempt.resumed_seconds: the training a resumed attempt salvaged.

The source's checkpointed ``train_seconds`` when the resumer read it. The
source may live on (a worker leaving under a preemption notice finishes its
attempt) and record its whole training afterwards; cost and goodput count
only this part as salvaged. Nullable, no backfill: older resumes fall back to
the source's recorded seconds.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 08:20:00

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.add_column(sa.Column("resumed_seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.drop_column("resumed_seconds")
