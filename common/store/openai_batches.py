"""What the OpenAI-compatible surface keeps and reads beside our own batches: the files
callers upload, the OpenAI facts of a batch made from one, its requests counted by how
they ended, and the expiry of a batch whose completion window closed.

An OpenAI batch is one of our batches (``batches``, ``batch_items``, ``jobs``) plus a
row of ``openai_batches``: it runs, is listed, reviewed and exported like any other.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from common.contracts import CancelReason, JobStatus
from common.store import cancels, webhooks
from common.store.ids import new_id
from common.store.openai_tables import OpenAIBatch, OpenAIFile
from common.store.tables import Batch, BatchItem, Job, utcnow

WAITING_OR_RUNNING = (JobStatus.QUEUED, JobStatus.DEFERRED, JobStatus.RUNNING)


def add_file(
    session: Session,
    tenant: str | None,
    filename: str,
    size: int,
    lines: int,
    path: str,
    purpose: str = "batch",
) -> OpenAIFile:
    row = OpenAIFile(
        id=f"file-{new_id()}",
        tenant=tenant,
        purpose=purpose,
        filename=filename,
        bytes=size,
        lines=lines,
        path=path,
    )
    session.add(row)
    session.flush()
    return row


def record_batch(
    session: Session,
    batch_id: str,
    *,
    input_file_id: str,
    endpoint: str,
    completion_window: str,
    window: timedelta,
    model: str,
    meta: dict[str, Any] | None,
) -> OpenAIBatch:
    row = OpenAIBatch(
        batch_id=batch_id,
        input_file_id=input_file_id,
        endpoint=endpoint,
        completion_window=completion_window,
        model=model,
        meta=meta,
        expires_at=utcnow() + window,
    )
    session.add(row)
    session.flush()
    return row


@dataclass(frozen=True)
class Requests:
    """An OpenAI batch's requests (its rows) by how they stand."""

    total: int
    done: int
    failed: int  # failed, cancelled or expired: each in the error file
    unfinished: int


def requests_of(session: Session, batch_id: str) -> Requests:
    by_status: Counter[str] = Counter(
        dict(
            session.execute(
                select(Job.status, func.count())
                .join(BatchItem, BatchItem.job_id == Job.id)
                .where(BatchItem.batch_id == batch_id)
                .group_by(Job.status)
            ).all()
        )
    )
    unfinished = sum(by_status[status] for status in WAITING_OR_RUNNING)
    failed = by_status[JobStatus.FAILED] + by_status[JobStatus.CANCELLED]
    total = sum(by_status.values())
    return Requests(total, by_status[JobStatus.DONE], failed, unfinished)


def status_of(row: OpenAIBatch, requests: Requests) -> str:
    """OpenAI's word for where the batch stands."""
    if requests.unfinished:
        stopping = row.cancelled_at is not None or row.expired_at is not None
        return "cancelling" if stopping else "in_progress"
    if row.expired_at is not None:
        return "expired"
    return "cancelled" if row.cancelled_at is not None else "completed"


def cancel(session: Session, row: OpenAIBatch) -> None:
    """Cancel what has not finished (what has is kept for the output file). A batch with
    nothing unfinished (ended, or cancelled already) stays as it is."""
    if requests_of(session, row.batch_id).unfinished and row.expired_at is None:
        row.cancelled_at = row.cancelled_at or utcnow()
        _stop(session, row.batch_id, CancelReason.CANCELLED)


def cancelled_elsewhere(session: Session, batch_id: str) -> None:
    """The batch was cancelled through ``/v1`` (``common.pipeline.cancel``): its OpenAI
    row, if it has one, says so too."""
    row = session.get(OpenAIBatch, batch_id)
    if row is not None and row.cancelled_at is None and row.expired_at is None:
        row.cancelled_at = utcnow()


def reopened(session: Session, batch_id: str) -> None:
    """The batch's stopped requests run again (``/v1`` resume or retry): it is in
    progress again, with a completion window as long as its first, from now."""
    row = session.get(OpenAIBatch, batch_id)
    batch = session.get(Batch, batch_id)
    if row is None or batch is None:
        return
    window = row.expires_at - batch.created_at
    row.cancelled_at = row.expired_at = row.swept_at = None
    row.expires_at = utcnow() + window


def expire_due(
    session: Session, batch_ids: list[str] | None = None, now: datetime | None = None
) -> list[str]:
    """Expire the batches (of ``batch_ids``, or all) whose completion window closed with
    requests unfinished: those are cancelled (``expired``), what finished is kept. A
    batch past its window with nothing unfinished is marked swept, not looked at again.
    The ids of the batches expired now."""
    query = select(OpenAIBatch).where(
        OpenAIBatch.expires_at <= (now or utcnow()),
        OpenAIBatch.expired_at.is_(None),
        OpenAIBatch.cancelled_at.is_(None),
        OpenAIBatch.swept_at.is_(None),
    )
    if batch_ids is not None:
        query = query.where(OpenAIBatch.batch_id.in_(batch_ids))
    expired = []
    for row in session.scalars(query.with_for_update(skip_locked=True)).all():
        row.swept_at = utcnow()
        if requests_of(session, row.batch_id).unfinished:
            row.expired_at = row.swept_at
            _stop(session, row.batch_id, CancelReason.EXPIRED)
            expired.append(row.batch_id)
    return expired


def _stop(session: Session, batch_id: str, reason: CancelReason) -> None:
    result = cancels.cancel(session, cancels.batch_own_jobs(batch_id), reason)
    batch = session.get(Batch, batch_id)
    if result.changed and batch is not None:
        webhooks.batch_cancelled(session, batch, reason)


def batches_of(
    session: Session, tenant: str | None, everyone: bool, after: str | None, limit: int
) -> list[tuple[Batch, OpenAIBatch]]:
    """A tenant's OpenAI batches (an admin: everyone's), newest first, after the batch
    ``after`` (an id of the last page)."""
    query = select(Batch, OpenAIBatch).join(OpenAIBatch, OpenAIBatch.batch_id == Batch.id)
    if not everyone:
        query = query.where(Batch.tenant.is_(None) if tenant is None else Batch.tenant == tenant)
    if after is not None:
        query = query.where(Batch.id < after)
    rows = session.execute(query.order_by(Batch.id.desc()).limit(limit)).all()
    return [(batch, row) for batch, row in rows]
