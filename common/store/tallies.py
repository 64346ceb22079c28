"""A batch's counts kept as its jobs change: the ``batch_tallies`` table (migration 0022,
whose SQLite triggers keep it; read by ``common.store.reads.batch_counts``)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from common.store.tables import Base, UtcDateTime


class BatchTally(Base):
    """A batch's counts, kept as its jobs change (SQLite: migration 0022's triggers keep
    them; PostgreSQL counts by a pass, and this stays empty): per group of the columns the
    counts group by, the sums ``reads.counts_of`` adds up ('' stands for none in a group
    column) and the earliest start and latest finish and review seen."""

    __tablename__ = "batch_tallies"

    batch_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True
    )
    status: Mapped[str] = mapped_column(String(64), primary_key=True)
    answered_by: Mapped[str] = mapped_column(String(64), primary_key=True)
    defer_reason: Mapped[str] = mapped_column(String(64), primary_key=True)
    error_code: Mapped[str] = mapped_column(String(64), primary_key=True)
    n: Mapped[int] = mapped_column(Integer, server_default="0")
    screened: Mapped[int] = mapped_column(Integer, server_default="0")
    tool_free: Mapped[int] = mapped_column(Integer, server_default="0")
    speculated: Mapped[int] = mapped_column(Integer, server_default="0")
    audited: Mapped[int] = mapped_column(Integer, server_default="0")
    agreed: Mapped[int] = mapped_column(Integer, server_default="0")
    reviewed: Mapped[int] = mapped_column(Integer, server_default="0")
    first_started: Mapped[datetime | None] = mapped_column(UtcDateTime())
    last_finished: Mapped[datetime | None] = mapped_column(UtcDateTime())
    last_reviewed: Mapped[datetime | None] = mapped_column(UtcDateTime())
