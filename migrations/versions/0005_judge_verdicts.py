"""judge_verdicts: an LLM judge's verdicts, cached by model and prompt; and
batch_items.judge_verdict: the verdict on a row the reference's rules left undecided.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "judge_verdicts",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("verdict", sa.Boolean(), nullable=False),
        sa.Column("response", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    with op.batch_alter_table("batch_items") as batch:
        batch.add_column(sa.Column("judge_verdict", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batch_items") as batch:
        batch.drop_column("judge_verdict")
    op.drop_table("judge_verdicts")
