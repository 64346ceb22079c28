"""Cancelling work, and taking cancelled or failed work up again.

A cancel never interrupts a stage in the middle of a step, and never loses a result:

- a job that waits (``queued``, ``deferred``) becomes ``cancelled`` at once, its reason
  in ``error_code``;
- a job that runs is marked (``cancel_requested`` holds the reason): its fast
  micro-batch finishes and its answer is kept if the gate accepted it; a trajectory stops
  before its next step (``common.pipeline.work.agent``). Whatever would put a marked job
  back to wait (a deferral, a release, a dead worker's job taken back) cancels it
  instead (``settle``);
- a finished job keeps its result;
- a pending audit of a cancelled job's answer is withdrawn (``audit_status`` cancelled).

Cancelling twice changes nothing the second time. ``requeue`` puts cancelled (a resume)
or failed jobs (a retry) back to wait for the stage they stopped in, with their
attempts counted afresh; a done job is never run again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, func, select, update
from sqlalchemy.orm import Session, aliased

from common.contracts import FINISHED, WAITING_FOR, CancelReason, JobStatus, Stage
from common.store import webhooks
from common.store.tables import BatchItem, Job, utcnow

AUDIT_PENDING, AUDIT_CANCELLED = "pending", "cancelled"  # (common.store.audits' states)
_WAITING = tuple(WAITING_FOR.values())


@dataclass(frozen=True)
class CancelResult:
    cancelled: int  # jobs that waited, cancelled now
    stopping: int  # running jobs marked: they stop at the end of their current step
    finished: int  # jobs that had finished already (cancelled ones included), kept
    marked: int = 0  # of the running ones, those marked by this call (not by an earlier one)

    @property
    def changed(self) -> bool:
        """Whether this call stopped anything (a second cancel of the same stops nothing)."""
        return bool(self.cancelled or self.marked)


def _jobs() -> Any:
    return update(Job).execution_options(synchronize_session=False)


def cancel(session: Session, job_ids: Any, reason: CancelReason) -> CancelResult:
    """Cancel the jobs ``job_ids`` names (a list, or a subquery of ids)."""
    now = utcnow()
    # The unfinished rows are locked first. Without it, a job a worker moves from running
    # to waiting at this moment (a deferral not yet committed) slips between the two
    # writes below: the first still reads it running, the second, once the worker
    # commits, finds it waiting; and the worker's settle saw no mark. Locked, each write
    # below reads it as the worker left it. (SQLite runs one writer at a time anyway.)
    unfinished = [*_WAITING, JobStatus.RUNNING]
    locked = select(Job.id).where(Job.id.in_(job_ids), Job.status.in_(unfinished))
    session.execute(locked.order_by(Job.id).with_for_update()).all()  # (in one order)
    waiting = session.execute(
        _jobs()
        .where(Job.id.in_(job_ids), Job.status.in_(_WAITING))
        .values(**_cancelled_values(reason, now))
    ).rowcount  # type: ignore[attr-defined]
    marked = session.execute(
        _jobs()
        .where(Job.id.in_(job_ids), Job.status == JobStatus.RUNNING)
        .where(Job.cancel_requested.is_(None))
        .values(cancel_requested=reason)
    ).rowcount  # type: ignore[attr-defined]
    session.execute(
        _jobs()
        .where(Job.id.in_(job_ids), Job.audit_status == AUDIT_PENDING)
        .values(audit_status=AUDIT_CANCELLED)
    )
    counts = dict(
        session.execute(
            select(Job.status, func.count()).where(Job.id.in_(job_ids)).group_by(Job.status)
        ).all()
    )
    finished = sum(counts.get(status, 0) for status in FINISHED) - waiting
    if waiting:
        webhooks.jobs_ended(session, job_ids)
    return CancelResult(waiting, counts.get(JobStatus.RUNNING, 0), finished, marked)


def batch_own_jobs(batch_id: str) -> Any:
    """A subquery of the batch's jobs that no other batch holds: what cancelling the batch
    may stop. A job two batches share (the same image, question and settings, in one
    tenant) goes on for the other, and counts in this one when it finishes."""
    other = aliased(BatchItem)
    shared = (
        select(other.job_id)
        .where(other.job_id == BatchItem.job_id, other.batch_id != batch_id)
        .exists()
    )
    return select(BatchItem.job_id).where(BatchItem.batch_id == batch_id, ~shared)


def _cancelled_values(reason: str, now: Any) -> dict[str, Any]:
    return {
        "status": JobStatus.CANCELLED,
        "error_code": reason,
        "error_message": _MESSAGES.get(reason, reason),
        "finished_at": now,
        "cancel_requested": None,
        "worker": None,
    }


_MESSAGES: dict[str, str] = {
    CancelReason.CANCELLED: "cancelled by its caller",
    CancelReason.FAILURE_BUDGET: "cancelled: its batch failed past its failure budget",
    CancelReason.SUPERSEDED: "cancelled: its row's image or question changed, and a new "
    "job answers it",
}


def settle(session: Session, job_ids: Sequence[str] | None = None) -> list[str]:
    """Settle the marks on ``job_ids`` (None: every marked job) after a stage's step: a
    marked job that waits for a stage again (a deferral, a release) is cancelled; one that
    finished keeps its result and loses the mark. The ids cancelled. Marked jobs are
    few: a partial index (``ix_jobs_cancel_requested``) finds them without reading the
    waiting ones."""
    if job_ids is not None and not job_ids:
        return []
    marked: Any = Job.cancel_requested.is_not(None)
    if job_ids is not None:
        marked = and_(marked, Job.id.in_(list(job_ids)))
    statement = (
        _jobs()
        .where(marked, Job.status.in_(_WAITING))
        .values(
            status=JobStatus.CANCELLED,
            error_code=Job.cancel_requested,
            error_message=case(
                *((Job.cancel_requested == code, text) for code, text in _MESSAGES.items()),
                else_=Job.cancel_requested,
            ),
            finished_at=utcnow(),
            cancel_requested=None,
            worker=None,
        )
        .returning(Job.id)
    )
    cancelled = list(session.scalars(statement))
    session.execute(_jobs().where(marked, Job.status.in_(FINISHED)).values(cancel_requested=None))
    webhooks.jobs_ended(session, cancelled)
    return cancelled


def requested(session: Session, job_id: str) -> bool:
    """Whether the job was asked to stop (marked while running, or cancelled already)."""
    row = session.execute(select(Job.status, Job.cancel_requested).where(Job.id == job_id)).first()
    return row is not None and (
        row.cancel_requested is not None or row.status == JobStatus.CANCELLED
    )


def stop_running(
    session: Session, job_id: str, stage: Stage, trajectory: Any = None, usage: Any = None
) -> bool:
    """Cancel a marked job its worker holds in ``stage`` (a trajectory stopped between
    steps; ``trajectory`` and ``usage``, if given: what it did and what that cost, kept)."""
    values = _cancelled_values(CancelReason.CANCELLED, utcnow())
    values["error_code"] = func.coalesce(Job.cancel_requested, CancelReason.CANCELLED)
    if trajectory is not None:
        values["trajectory"] = trajectory
    if usage is not None:
        values["agent_usage"] = usage
    statement = (
        _jobs()
        .where(Job.id == job_id, Job.status == JobStatus.RUNNING, Job.stage == stage)
        .values(**values)
    )
    return bool(session.execute(statement).rowcount)  # type: ignore[attr-defined]


def requeue(
    session: Session, job_ids: Any, statuses: Sequence[str], code: str | None = None
) -> list[str]:
    """Put the jobs ``job_ids`` names that are in one of ``statuses`` (cancelled: a resume;
    failed: a retry), and of ``code`` if given, back to wait for the stage they stopped
    in. Their error is cleared and their attempts counted afresh; the ids requeued. A
    job whose image was never kept (refused at intake) stays as it is: it could only
    fail again. Running jobs of ``job_ids`` lose a cancel's mark: taken up again, they
    finish as if never cancelled."""
    session.execute(
        _jobs()
        .where(Job.id.in_(job_ids), Job.status == JobStatus.RUNNING)
        .where(Job.cancel_requested.is_not(None))
        .values(cancel_requested=None)
    )
    condition = and_(
        Job.id.in_(job_ids), Job.status.in_(list(statuses)), Job.image_path.is_not(None)
    )
    if code is not None:
        condition = and_(condition, Job.error_code == code)
    waiting = case(
        *((Job.stage == stage, status) for stage, status in WAITING_FOR.items()),
        else_=JobStatus.QUEUED,
    )
    statement = (
        _jobs()
        .where(condition)
        .values(
            status=waiting,
            attempts=0,
            error_code=None,
            error_message=None,
            finished_at=None,
            cancel_requested=None,
            worker=None,
        )
        .returning(Job.id)
    )
    return list(session.scalars(statement))
