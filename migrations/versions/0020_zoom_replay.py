"""Calibration runs at speculation depth D >= 1 keep what replaying each depth d <= D needs.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("zoom_replay", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "zoom_replay")
