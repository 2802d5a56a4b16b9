"""Add attempt.worker_name: the Dask worker's name beside its address.

A worker's address changes when it restarts (a new port, a new spot
machine) or when a resumed driver starts a new local cluster; its name does
not, when it has one (a LocalCluster numbers its workers, ``dask worker
--name`` sets one; Dask names an unnamed worker by its address). The
throughput plan (vcdl/driver/throughput.py) measures and pins workers by
this name, so that a resumed driver's new cluster carries out the recorded
plan on the workers it was sized for. Nullable, no backfill: NULL is an
attempt recorded before, measured by its address as it was.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-30 03:40:00

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.add_column(sa.Column("worker_name", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.drop_column("worker_name")
