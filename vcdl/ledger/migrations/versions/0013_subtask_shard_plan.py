"""Add subtask.rows and subtask.worker: the throughput plan of an epoch.

With ``cluster.sizing = "throughput"`` the driver sizes each shard of an
epoch by its worker's measured throughput (vcdl/data/sizing.py) and pins it
to that worker: ``rows`` is the shard's number of training rows (the
epoch's shards cut one seeded order of the rows in shard order, so the
sizes alone give every shard's rows) and ``worker`` the Dask address it was
pinned to. A worker computes its rows from them, and ``vcdl replay`` and
``vcdl resume`` rebuild the plan from them. Nullable, no backfill: NULL is
the even plan, every subtask recorded before and every ``even`` run's.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29 13:45:00

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("subtask", schema=None) as batch_op:
        batch_op.add_column(sa.Column("rows", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("worker", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("subtask", schema=None) as batch_op:
        batch_op.drop_column("worker")
        batch_op.drop_column("rows")
