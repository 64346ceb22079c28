"""batch_items.split and .category: where a benchmark row comes from (``vstar/...``,
``hr/...``, ``pope/...``) and its category, for per-split scores.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("batch_items") as batch:
        batch.add_column(sa.Column("split", sa.String(100), nullable=True))
        batch.add_column(sa.Column("category", sa.String(100), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batch_items") as batch:
        batch.drop_column("category")
        batch.drop_column("split")
