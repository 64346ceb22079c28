"""Indexes for the review queue's tiers, so that a million-job batch's queue reads the
few jobs it lists, not the batch (issue 49: 1.25 s on SQLite at a million).

- ``ix_jobs_margin``: the accepted answers in order of their margin over tau (the
  near-threshold tier), by the expression ``common.store.expressions.GateMargin`` writes
  for each store;
- ``ix_jobs_disagreed``: the few jobs whose audit disagreed (partial).

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MARGIN = {
    "sqlite": "(confidence - json_extract(gate, '$.threshold'))",
    "postgresql": "(confidence - CASE WHEN json_typeof(gate -> 'threshold') = 'number' "
    "THEN CAST(gate ->> 'threshold' AS DOUBLE PRECISION) END)",
}
DISAGREED = {"sqlite": "audit_agrees IS 0", "postgresql": "audit_agrees IS false"}


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.execute(f"CREATE INDEX ix_jobs_margin ON jobs (answered_by, {MARGIN[dialect]})")
    op.create_index(
        "ix_jobs_disagreed",
        "jobs",
        ["id"],
        postgresql_where=sa.text(DISAGREED["postgresql"]),
        sqlite_where=sa.text(DISAGREED["sqlite"]),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_disagreed", table_name="jobs")
    op.drop_index("ix_jobs_margin", table_name="jobs")
