"""Versions record when the retention policy pruned their weights.

``version.pruned_at``: NULL while the version's group is kept; the time the
weights were let go otherwise (``store.keep``, ``vcdl gc``). The row itself
stays: lineage, alpha, staleness and checksum still audit. No backfill:
every version of an older ledger still has its weights.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 05:00:00

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A nullable column with no default: a plain ADD COLUMN on both backends
    # (no table copy on SQLite).
    op.add_column("version", sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("version", schema=None) as batch_op:
        batch_op.drop_column("pruned_at")
