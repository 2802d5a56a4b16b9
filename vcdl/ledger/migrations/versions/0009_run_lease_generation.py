"""Runs carry their lease's generation: the fencing token of the driver that holds it.

``run.lease_generation``: 0 for a run never driven; each driver that takes
the lease from another (or from nobody) raises it by one, and every ledger
write a driver makes is refused unless the run's generation is still the
one it took (vcdl/ledger/fence.py). Older ledgers start at 0: the first
driver after the upgrade takes generation 1.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28 18:00:00

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # NOT NULL with a constant default: a plain ADD COLUMN on both backends
    # (no table copy on SQLite, no rewrite on PostgreSQL 11+).
    op.add_column(
        "run",
        sa.Column("lease_generation", sa.BigInteger(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    with op.batch_alter_table("run", schema=None) as batch_op:
        batch_op.drop_column("lease_generation")
