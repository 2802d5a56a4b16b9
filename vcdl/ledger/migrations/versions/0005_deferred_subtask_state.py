"""Make "deferred" a subtask state: shards the quorum policy leaves to a later epoch.

Until now such a subtask stayed "pending" with the reason "deferred"; the
driver found it by its reason. Rows in that form become state "deferred" (the
reason is kept). A data migration only: the column is free text.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 23:00:00

"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "UPDATE subtask SET state = 'deferred' WHERE state = 'pending' AND reason = 'deferred'"
    )


def downgrade() -> None:
    op.execute("UPDATE subtask SET state = 'pending', reason = 'deferred' WHERE state = 'deferred'")
