"""When each waiting job's message went to the broker, and which messages are overdue.

A broker's queue is first in, first out (per priority). So a job whose message went out
before the oldest message still on its queue has no message there any more: a worker took
it (then the job runs, is finished, or the message is held unacknowledged), or it was
lost. The reconciler (``common.pipeline.reconcile``) asks the store only for such jobs,
in the order they were sent and at most a slice at a time, through the index that leads
with status, priority and ``sent_at``: its cost does not grow with the backlog.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from common.contracts import WAITING_FOR, Queue, Stage
from common.store.audits import PENDING
from common.store.tables import Job, utcnow

STAMP_CHUNK = 1000  # ids per UPDATE
_STATUS = {Queue.FAST: WAITING_FOR[Stage.FAST], Queue.SLOW: WAITING_FOR[Stage.AGENT]}
_QUEUE_OF: dict[str, Queue] = {status: queue for queue, status in _STATUS.items()}


def stamp(session: Session, job_ids: Iterable[str], at: datetime | None = None) -> None:
    """Note that a message for each of ``job_ids`` goes out now (or ``at``)."""
    ids, when = list(job_ids), at or utcnow()
    for start in range(0, len(ids), STAMP_CHUNK):
        chunk = ids[start : start + STAMP_CHUNK]
        session.execute(update(Job).where(Job.id.in_(chunk)).values(sent_at=when))


def overdue(
    session: Session, queue: Queue, rank: int | None, before: datetime, limit: int
) -> list[str]:
    """Up to ``limit`` jobs waiting for ``queue`` (at priority ``rank``; None: any, as
    audits are) whose last message went out before ``before``, the longest gone first."""
    if queue == Queue.AUDIT:
        waits = Job.audit_status == PENDING
    else:
        waits = Job.status == _STATUS[queue]
        if rank is not None:
            waits = waits & (Job.priority == rank)
    # (none: a row written by a version before sent_at, whose message may be long gone)
    gone = or_(Job.sent_at.is_(None), Job.sent_at < before)
    query = select(Job.id).where(waits, gone).order_by(Job.sent_at.asc().nulls_first())
    return list(session.scalars(query.limit(limit)))


def waiting_of(session: Session, job_ids: Iterable[str]) -> dict[Queue, list[str]]:
    """Which of ``job_ids`` wait, and for which queue (a job that waits for no stage but
    for its audit: the audit queue)."""
    ids, found = list(job_ids), dict[Queue, list[str]]()
    for start in range(0, len(ids), STAMP_CHUNK):
        chunk = ids[start : start + STAMP_CHUNK]
        query = select(Job.id, Job.status, Job.audit_status).where(Job.id.in_(chunk))
        for job_id, status, audit in session.execute(query):
            queue = _QUEUE_OF.get(status) or (Queue.AUDIT if audit == PENDING else None)
            if queue is not None:
                found.setdefault(queue, []).append(job_id)
    return found
