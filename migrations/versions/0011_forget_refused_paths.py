"""Forget the server paths that refused API batch jobs kept: a job of an API batch that
failed at intake (no image was read: no content hash) held the path its request named,
though the API had refused it (outside the image roots, or not there); the review pages'
image routes would serve what a stored path points at. Those paths are set to NULL (the
job stays failed, its code and message as they were). Nothing to undo.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        UPDATE jobs SET image_path = NULL
        WHERE status = 'failed' AND image_hash IS NULL AND image_path IS NOT NULL
          AND id IN (
            SELECT batch_items.job_id FROM batch_items
            JOIN batches ON batches.id = batch_items.batch_id
            WHERE batches.source = 'api'
          )
        """
    )


def downgrade() -> None:
    pass  # the paths are gone, as they should be
