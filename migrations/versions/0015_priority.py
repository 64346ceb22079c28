"""Priorities: a job's (0 high, 1 normal, 2 low), the most urgent one an API key's jobs
may ask for, and the index a claim in order reads (waiting jobs by priority, then age).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "jobs", sa.Column("priority", sa.SmallInteger(), nullable=False, server_default="1")
    )
    op.add_column(
        "api_keys",
        sa.Column("max_priority", sa.SmallInteger(), nullable=False, server_default="0"),
    )
    op.create_index("ix_jobs_claim_order", "jobs", ["status", "priority", "created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_claim_order", table_name="jobs")
    op.drop_column("api_keys", "max_priority")
    op.drop_column("jobs", "priority")
