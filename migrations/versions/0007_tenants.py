"""Tenants: every API key belongs to one (admin keys read all); jobs and batches made
through the API carry their tenant. Existing keys become tenants of their own name;
existing jobs and batches have none (made by the command line, or before tenants), so
only an admin key reads them through the API.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("tenant", sa.String(200), nullable=True))
        batch.add_column(
            sa.Column("admin", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    op.execute("UPDATE api_keys SET tenant = name")
    with op.batch_alter_table("api_keys") as batch:
        batch.alter_column("tenant", existing_type=sa.String(200), nullable=False)
    for table in ("jobs", "batches"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("tenant", sa.String(200), nullable=True))
    op.create_index("ix_jobs_tenant_status", "jobs", ["tenant", "status"])
    op.create_index("ix_batches_tenant", "batches", ["tenant"])


def downgrade() -> None:
    op.drop_index("ix_batches_tenant", "batches")
    op.drop_index("ix_jobs_tenant_status", "jobs")
    for table in ("batches", "jobs"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("tenant")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("admin")
        batch.drop_column("tenant")
