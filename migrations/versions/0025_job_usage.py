"""What each job cost, a stage a column (issue 50): ``fast_usage`` (its share of the
screen, speculate and gate calls of its micro-batch, and its tokens) and
``agent_usage`` (its trajectory's generations and tools), ``audit_usage`` (an accepted
job's audit: the agent on it, what an accepted job would have cost). The shape is
``common.contracts.Usage``; jobs recorded before hold none. ``ix_jobs_tenant_finished``
serves a tenant's usage by day (``GET /v1/usage``), ``ix_jobs_tenant_created`` its jobs
made today, and an API key may set its tenant's daily quotas (``jobs_per_day``,
``compute_s_per_day``: ``api.quotas``).

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # (one column at a time: a batch alter would rebuild the table on SQLite, and lose
    # its triggers and expression indexes)
    op.add_column("jobs", sa.Column("fast_usage", sa.JSON(), nullable=True))
    op.add_column("jobs", sa.Column("agent_usage", sa.JSON(), nullable=True))
    op.add_column("jobs", sa.Column("audit_usage", sa.JSON(), nullable=True))
    op.create_index("ix_jobs_tenant_finished", "jobs", ["tenant", "finished_at"])
    op.create_index("ix_jobs_tenant_created", "jobs", ["tenant", "created_at"])
    op.add_column("api_keys", sa.Column("jobs_per_day", sa.Integer(), nullable=True))
    op.add_column("api_keys", sa.Column("compute_s_per_day", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("api_keys", "compute_s_per_day")
    op.drop_column("api_keys", "jobs_per_day")
    op.drop_index("ix_jobs_tenant_created", table_name="jobs")
    op.drop_index("ix_jobs_tenant_finished", table_name="jobs")
    op.drop_column("jobs", "audit_usage")
    op.drop_column("jobs", "agent_usage")
    op.drop_column("jobs", "fast_usage")
