"""Initial schema: jobs, batches, batch_items.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _timestamp(name: str, nullable: bool = True) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "batches",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("key", sa.String(64), nullable=False, unique=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        _timestamp("created_at", nullable=False),
    )
    op.create_index("ix_batches_name", "batches", ["name"])
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("idempotency_key", sa.String(64), nullable=False, unique=True),
        sa.Column("image_path", sa.Text()),
        sa.Column("image_hash", sa.String(64)),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("options", sa.JSON()),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("stage", sa.String(8), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("screen_needs_tools", sa.Boolean()),
        sa.Column("screen_text", sa.Text()),
        sa.Column("small_answer", sa.Text()),
        sa.Column("confidence", sa.Float()),
        sa.Column("token_scores", sa.JSON()),
        sa.Column("gate", sa.JSON()),
        sa.Column("defer_reason", sa.String(32)),
        sa.Column("trajectory", sa.JSON()),
        sa.Column("answered_by", sa.String(8)),
        sa.Column("final_answer", sa.Text()),
        sa.Column("error_code", sa.String(64)),
        sa.Column("error_message", sa.Text()),
        _timestamp("created_at", nullable=False),
        _timestamp("fast_started_at"),
        _timestamp("gated_at"),
        _timestamp("agent_started_at"),
        _timestamp("finished_at"),
    )
    op.create_index("ix_jobs_status", "jobs", ["status"])
    op.create_table(
        "batch_items",
        sa.Column(
            "batch_id",
            sa.String(32),
            sa.ForeignKey("batches.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("position", sa.Integer(), primary_key=True),
        sa.Column("item_id", sa.Text(), nullable=False),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id"), nullable=False),
    )
    op.create_index("ix_batch_items_job_id", "batch_items", ["job_id"])


def downgrade() -> None:
    op.drop_table("batch_items")
    op.drop_table("jobs")
    op.drop_table("batches")
