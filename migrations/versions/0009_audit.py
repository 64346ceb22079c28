"""Online audit: a sample of accepted answers also runs through the agent; its answer and
whether the two agree are kept beside the job. A batch keeps its drift alarm; controls
hold what an alarm changed for the whole deployment (a raised tau, accepting paused).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("audit_status", sa.String(16), nullable=True))
        batch.add_column(sa.Column("audit_answer", sa.Text(), nullable=True))
        batch.add_column(sa.Column("audit_agrees", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("audit_error", sa.Text(), nullable=True))
        batch.add_column(sa.Column("audited_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_jobs_audit_status", "jobs", ["audit_status"])
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("audit_alarm", sa.JSON(), nullable=True))
    op.create_table(
        "controls",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.Column("set_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("controls")
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("audit_alarm")
    op.drop_index("ix_jobs_audit_status", "jobs")
    with op.batch_alter_table("jobs") as batch:
        for column in ("audited_at", "audit_error", "audit_agrees", "audit_answer", "audit_status"):
            batch.drop_column(column)
