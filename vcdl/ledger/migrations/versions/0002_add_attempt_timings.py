"""Add attempt.timings: seconds per phase of an attempt, as a JSON object.

Nullable, no backfill: attempts recorded before it have no breakdown.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21 15:14:48.828939

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.add_column(sa.Column("timings", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.drop_column("timings")
