"""Each job keeps when its last message went out, so the reconciler reads only the jobs
whose message is older than a broker's oldest, not every waiting job.

The jobs that wait or run now take their creation time (their message went out then, or later:
the reconciler sends a job again only once the broker's queue has moved past it). The
indexes on ``status`` and ``audit_status`` alone give way to ones that lead with them,
a prune finds the jobs finished before a date by an index of their own, and the failed
jobs' codes have a partial index (SQLite's statistics cannot tell that few jobs fail).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(
        "UPDATE jobs SET sent_at = created_at "
        "WHERE status IN ('queued', 'deferred', 'running') "
        "OR audit_status IN ('pending', 'running')"
    )
    op.drop_index("ix_jobs_status", table_name="jobs")
    op.drop_index("ix_jobs_audit_status", table_name="jobs")
    op.create_index("ix_jobs_sent", "jobs", ["status", "priority", "sent_at"])
    op.create_index("ix_jobs_audit_sent", "jobs", ["audit_status", "sent_at"])
    op.create_index("ix_jobs_finished", "jobs", ["finished_at"])
    failed = sa.text("status = 'failed'")
    op.create_index(
        "ix_jobs_failed", "jobs", ["error_code"], postgresql_where=failed, sqlite_where=failed
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_failed", table_name="jobs")
    op.drop_index("ix_jobs_finished", table_name="jobs")
    op.drop_index("ix_jobs_audit_sent", table_name="jobs")
    op.drop_index("ix_jobs_sent", table_name="jobs")
    op.create_index("ix_jobs_audit_status", "jobs", ["audit_status"])
    op.create_index("ix_jobs_status", "jobs", ["status"])
    op.drop_column("jobs", "sent_at")
