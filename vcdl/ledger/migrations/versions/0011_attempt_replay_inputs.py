"""Add attempt.replay_inputs: what re-training an attempt needs besides the run's config.

A JSON object the worker records just before it trains (``vcdl replay``,
docs/replay.md): the seed, the samples of the checkpoint it resumed (the
attempt it resumed is ``resumed_from``), the earlier attempt whose optimizer
state (``train.optimizer_state = "worker"``) or EASGD variable it continued
from, its device, autocast, threads and torch version, and the result
precision. Nullable, no backfill: an attempt recorded before has NULL, and a
run with such an attempt merged says it cannot be replayed and why.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29 06:05:00

"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.add_column(sa.Column("replay_inputs", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempt", schema=None) as batch_op:
        batch_op.drop_column("replay_inputs")
