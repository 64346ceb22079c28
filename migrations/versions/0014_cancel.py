"""Cancelling: a running job asked to stop keeps the reason until its step ends, in a
column a partial index finds (few jobs are marked at any time).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("cancel_requested", sa.String(32), nullable=True))
    marked = sa.text("cancel_requested IS NOT NULL")
    op.create_index(
        "ix_jobs_cancel_requested",
        "jobs",
        ["id"],
        postgresql_where=marked,
        sqlite_where=marked,
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_cancel_requested", table_name="jobs")
    op.drop_column("jobs", "cancel_requested")
