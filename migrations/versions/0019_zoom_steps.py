"""Speculation in depth: the small model's zoom steps before the gate, kept with its job.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("zoom_steps", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "zoom_steps")
