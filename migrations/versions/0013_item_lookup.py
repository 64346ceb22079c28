"""Rows of a batch found by their id: a corpus of millions of rows submitted again finds
the rows it holds a chunk at a time. A hash index in PostgreSQL (an id may be longer than
a B-tree entry may be); a plain one in SQLite.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_batch_items_item_id", "batch_items", ["item_id"], postgresql_using="hash")


def downgrade() -> None:
    op.drop_index("ix_batch_items_item_id", table_name="batch_items")
