"""Texts as the reference has them: what it scores, where that is not the answer people
read (an unclosed ``<answer>``: the whole output; Thyme's SpecReason: its whole last
step), and a benchmark image's path as Thyme's evaluation names it in the first turn.
SpecReason's jobs are told apart by ``defer_reason`` ("specreason"): no column.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("scored_answer", sa.Text(), nullable=True))
        batch.add_column(sa.Column("shown_path", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("shown_path")
        batch.drop_column("scored_answer")
