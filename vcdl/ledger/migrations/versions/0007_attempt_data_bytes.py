"""Add attempt.data_bytes, data_requests, written_bytes: an attempt's traffic with the store.

``data_bytes``: training data the attempt fetched (compressed chunk bytes as
the store returned them; a cache hit fetches only metadata), in
``data_requests`` GETs. ``written_bytes``: the
tensors of its result and checkpoints. ``vcdl cost`` prices them for an S3
store. Nullable, no backfill: older attempts did not measure them.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 04:45:00

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.add_column(sa.Column("data_bytes", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("data_requests", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("written_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.drop_column("written_bytes")
        batch_op.drop_column("data_requests")
        batch_op.drop_column("data_bytes")
