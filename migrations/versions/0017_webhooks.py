"""Webhooks: the tenants' endpoints and callback secrets, the outbox of events, their
deliveries and each attempt; a batch's and a single job's callback URL, whether a job
announces its end, and when an end was last announced.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MOMENT = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("batches", sa.Column("callback_url", sa.Text(), nullable=True))
    op.add_column("batches", sa.Column("announced_at", MOMENT, nullable=True))
    op.add_column(
        "jobs", sa.Column("announces", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.add_column("jobs", sa.Column("callback_url", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("announced_at", MOMENT, nullable=True))
    op.create_table(
        "webhook_endpoints",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("tenant", sa.String(200), nullable=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("secret", sa.String(100), nullable=False),
        sa.Column("created_at", MOMENT, nullable=False),
        sa.Column("removed_at", MOMENT, nullable=True),
    )
    op.create_index("ix_webhook_endpoints_tenant", "webhook_endpoints", ["tenant"])
    op.create_table(
        "webhook_secrets",
        sa.Column("owner", sa.String(200), primary_key=True),
        sa.Column("secret", sa.String(100), nullable=False),
        sa.Column("created_at", MOMENT, nullable=False),
    )
    op.create_table(
        "webhook_events",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("tenant", sa.String(200), nullable=True),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("subject", sa.String(32), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", MOMENT, nullable=False),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column(
            "event_id",
            sa.String(32),
            sa.ForeignKey("webhook_events.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("tenant", sa.String(200), nullable=True),
        sa.Column("endpoint_id", sa.String(32), nullable=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_at", MOMENT, nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", MOMENT, nullable=False),
        sa.Column("finished_at", MOMENT, nullable=True),
    )
    op.create_index("ix_webhook_deliveries_event_id", "webhook_deliveries", ["event_id"])
    op.create_index("ix_webhook_deliveries_tenant", "webhook_deliveries", ["tenant"])
    op.create_index("ix_webhook_deliveries_due", "webhook_deliveries", ["state", "next_at"])
    op.create_table(
        "webhook_attempts",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column(
            "delivery_id",
            sa.String(32),
            sa.ForeignKey("webhook_deliveries.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("at", MOMENT, nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("seconds", sa.Float(), nullable=False),
    )
    op.create_index("ix_webhook_attempts_delivery_id", "webhook_attempts", ["delivery_id"])


def downgrade() -> None:
    op.drop_table("webhook_attempts")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_events")
    op.drop_table("webhook_secrets")
    op.drop_table("webhook_endpoints")
    op.drop_column("jobs", "announced_at")
    op.drop_column("jobs", "callback_url")
    op.drop_column("jobs", "announces")
    op.drop_column("batches", "announced_at")
    op.drop_column("batches", "callback_url")
