"""A tenant's usage indexes hold only the jobs that have a tenant (issue 50).

``ix_jobs_tenant_finished`` (a tenant's usage by day, and its compute quota) and
``ix_jobs_tenant_created`` (its jobs made today) are read for one tenant at a time, and
only an API key's tenant has a quota; the command line's jobs (no tenant) made every
insert and every status change update two more indexes for nothing. Their usage by day
reads ``ix_jobs_finished``.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = {"ix_jobs_tenant_finished": "finished_at", "ix_jobs_tenant_created": "created_at"}


def upgrade() -> None:
    tenant = sa.text("tenant IS NOT NULL")
    for name, column in INDEXES.items():
        op.drop_index(name, table_name="jobs")
        op.create_index(
            name, "jobs", ["tenant", column], postgresql_where=tenant, sqlite_where=tenant
        )


def downgrade() -> None:
    for name, column in INDEXES.items():
        op.drop_index(name, table_name="jobs")
        op.create_index(name, "jobs", ["tenant", column])
