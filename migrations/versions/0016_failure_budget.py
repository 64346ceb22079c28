"""A batch's failure budget: the share of failed jobs past which the rest is cancelled,
how many jobs must have finished first, and why the batch was stopped, if it was.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("max_failure_rate", sa.Float(), nullable=True))
    op.add_column("batches", sa.Column("budget_after", sa.Integer(), nullable=True))
    op.add_column("batches", sa.Column("stopped", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("batches", "stopped")
    op.drop_column("batches", "budget_after")
    op.drop_column("batches", "max_failure_rate")
