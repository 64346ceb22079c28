"""Reviews: a person's confirmed or corrected answer, kept beside the model's (never over
it), with who gave it and when. The columns a batch's counts read get an index of their
own (``ix_jobs_summary``), so the review pages count a 100,000-job batch from it alone.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SUMMARY = [
    "id",
    "status",
    "answered_by",
    "defer_reason",
    "error_code",
    "screen_needs_tools",
    "confidence",
    "audit_status",
    "audit_agrees",
    "fast_started_at",
    "finished_at",
    "reviewed_at",
]


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("reviewed_answer", sa.Text(), nullable=True))
        batch.add_column(sa.Column("reviewer", sa.String(200), nullable=True))
        batch.add_column(sa.Column("reviewed_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_jobs_summary", "jobs", SUMMARY)


def downgrade() -> None:
    op.drop_index("ix_jobs_summary", "jobs")
    with op.batch_alter_table("jobs") as batch:
        for column in ("reviewed_at", "reviewer", "reviewed_answer"):
            batch.drop_column(column)
