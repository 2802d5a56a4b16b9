"""Add attempt.checkpoint_uri and attempt.resumed_from: salvaging killed attempts.

``checkpoint_uri``: the newest durable checkpoint of an attempt's training so
far, where a replacement resumes if the attempt dies. ``resumed_from``: the
attempt whose checkpoint an attempt started from. Nullable, no backfill:
attempts recorded before have neither.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 05:00:00

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.add_column(sa.Column("checkpoint_uri", sa.String(), nullable=True))
        batch_op.add_column(sa.Column("resumed_from", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.drop_column("resumed_from")
        batch_op.drop_column("checkpoint_uri")
