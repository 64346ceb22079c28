"""The tables of the OpenAI-compatible surface (``api.openai``; migration 0018).

- ``openai_files``: a JSONL of requests a caller uploaded (``POST /openai/v1/files``),
  kept as a file under ``upload_dir``; the row says whose it is and how large.
- ``openai_batches``: what OpenAI's batch adds to one of our batches: the file it was
  made from, its endpoint, its completion window and when it was cancelled or expired.
  Its requests are the batch's rows (``item_id``: the request's ``custom_id``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from common.store.tables import Base, UtcDateTime, utcnow


class OpenAIFile(Base):
    __tablename__ = "openai_files"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # file-<32 hex>
    tenant: Mapped[str | None] = mapped_column(String(200), index=True)  # None: keys off
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int] = mapped_column(Integer)
    lines: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class OpenAIBatch(Base):
    __tablename__ = "openai_batches"

    batch_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True
    )
    input_file_id: Mapped[str] = mapped_column(String(40))
    endpoint: Mapped[str] = mapped_column(String(64))
    completion_window: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(64))
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # the caller's metadata
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime(), index=True)
    cancelled_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    expired_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    # when the expiry sweep found it over (nothing unfinished past its window): it is
    # not looked at again
    swept_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
