"""The OpenAI-compatible surface: uploaded request files, and what OpenAI's batch adds
to one of ours (its file, endpoint, completion window, cancel and expiry).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MOMENT = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "openai_files",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("tenant", sa.String(200), nullable=True),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("lines", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("created_at", MOMENT, nullable=False),
    )
    op.create_index("ix_openai_files_tenant", "openai_files", ["tenant"])
    op.create_table(
        "openai_batches",
        sa.Column(
            "batch_id",
            sa.String(32),
            sa.ForeignKey("batches.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("input_file_id", sa.String(40), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("completion_window", sa.String(16), nullable=False),
        sa.Column("model", sa.String(64), nullable=False),
        sa.Column("meta", sa.JSON(), nullable=True),
        sa.Column("expires_at", MOMENT, nullable=False),
        sa.Column("cancelled_at", MOMENT, nullable=True),
        sa.Column("expired_at", MOMENT, nullable=True),
        sa.Column("swept_at", MOMENT, nullable=True),
    )
    op.create_index("ix_openai_batches_expires_at", "openai_batches", ["expires_at"])


def downgrade() -> None:
    op.drop_table("openai_batches")
    op.drop_table("openai_files")
