"""The audit's rows: which accepted jobs are audited, their runs, their agreement, and the
deployment-wide controls an alarm sets. Every write names the state it expects, as in
``claims``: a second delivery of an audit changes nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from common.contracts import JobStatus, Ticket
from common.store.reads import batch_jobs
from common.store.tables import BatchItem, Control, Job, utcnow

PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"


def keys_of(session: Session, job_ids: Sequence[str]) -> dict[str, str]:
    rows = session.execute(select(Job.id, Job.idempotency_key).where(Job.id.in_(list(job_ids))))
    return {job_id: key for job_id, key in rows}


def request(session: Session, job_ids: Sequence[str]) -> list[str]:
    """Mark accepted jobs for an audit; returns those newly marked."""
    if not job_ids:
        return []
    statement = (
        update(Job)
        .execution_options(synchronize_session=False)
        .where(Job.id.in_(list(job_ids)), Job.status == JobStatus.DONE, Job.audit_status.is_(None))
        .values(audit_status=PENDING)
        .returning(Job.id)
    )
    return list(session.scalars(statement))


def claim(
    session: Session,
    job_ids: Sequence[str] | None = None,
    limit: int = 1,
    batch_id: str | None = None,
    worker: str | None = None,
) -> list[Ticket]:
    """Move pending audits (the named ones, or the oldest ``limit``, of ``batch_id`` if
    given) to running."""
    query = select(Job.id).where(Job.audit_status == PENDING)
    if job_ids is not None:
        query = query.where(Job.id.in_(list(job_ids)))
    if batch_id is not None:
        query = query.where(Job.id.in_(batch_jobs(batch_id)))
    ids = list(session.scalars(query.order_by(Job.created_at, Job.id).limit(limit)))
    if not ids:
        return []
    statement = (
        update(Job)
        .execution_options(synchronize_session=False)
        .where(Job.id.in_(ids), Job.audit_status == PENDING)
        .values(audit_status=RUNNING, worker=worker)
        .returning(
            Job.id, Job.image_path, Job.image_hash, Job.question, Job.options, Job.shown_path
        )
    )
    return [Ticket(*row[:5], shown_path=row.shown_path) for row in session.execute(statement).all()]


def record(
    session: Session,
    job_id: str,
    answer: str | None,
    agrees: bool | None,
    error: str | None,
    usage: dict[str, Any] | None = None,
) -> bool:
    """Record an audit's end (an answer and whether it agrees, or the error; ``usage``:
    what its run of the agent cost)."""
    values: dict[str, Any] = {"audit_status": DONE if error is None else FAILED}
    if usage is not None:
        values["audit_usage"] = usage
    values |= {"audit_answer": answer, "audit_agrees": agrees, "audit_error": error}
    values["audited_at"] = utcnow()
    statement = update(Job).where(Job.id == job_id, Job.audit_status == RUNNING).values(values)
    return bool(session.execute(statement).rowcount)  # type: ignore[attr-defined]


def put_back(session: Session, job_id: str) -> bool:
    """A running audit back to pending (its run will be tried again)."""
    statement = update(Job).where(Job.id == job_id, Job.audit_status == RUNNING)
    return bool(session.execute(statement.values(audit_status=PENDING)).rowcount)  # type: ignore[attr-defined]


def release(session: Session) -> int:
    """Running audits back to pending (a restarted embedded run)."""
    statement = update(Job).where(Job.audit_status == RUNNING).values(audit_status=PENDING)
    return int(session.execute(statement).rowcount)  # type: ignore[attr-defined]


def waiting(session: Session) -> list[str]:
    """Audits waiting to be taken."""
    return list(session.scalars(select(Job.id).where(Job.audit_status == PENDING)))


def release_orphans(session: Session, live: set[str]) -> list[str]:
    """Running audits whose worker is not among ``live`` back to pending."""
    held = [Job.audit_status == RUNNING, Job.worker.is_not(None)]
    statement = (
        update(Job)
        .execution_options(synchronize_session=False)
        .where(*held, *([Job.worker.not_in(live)] if live else []))
        .values(audit_status=PENDING, worker=None)
        .returning(Job.id)
    )
    return list(session.scalars(statement))


def unfinished(session: Session, batch_id: str | None = None) -> list[str]:
    """Audits waiting to run (pending) or running, of ``batch_id`` if given."""
    query = select(Job.id).where(Job.audit_status.in_([PENDING, RUNNING]))
    if batch_id is not None:
        query = query.where(Job.id.in_(batch_jobs(batch_id)))
    return list(session.scalars(query))


def counts(session: Session, batch_id: str | None = None) -> tuple[int, int]:
    """(audited, agreed) over a batch's jobs, or over all."""
    query = select(func.count(), func.count().filter(Job.audit_agrees.is_(True))).where(
        Job.audit_status == DONE
    )
    if batch_id is not None:
        query = query.where(Job.id.in_(batch_jobs(batch_id)))
    audited, agreed = session.execute(query).one()
    return int(audited), int(agreed)


def batches_of(session: Session, job_id: str) -> list[str]:
    return list(session.scalars(select(BatchItem.batch_id).where(BatchItem.job_id == job_id)))


def disagreements(session: Session, batch_id: str) -> list[Job]:
    query = select(Job).where(Job.id.in_(batch_jobs(batch_id)), Job.audit_agrees.is_(False))
    return list(session.scalars(query.order_by(Job.created_at)))


# -- controls ---------------------------------------------------------------------------
def controls(session: Session) -> dict[str, Any]:
    return {name: value for name, value in session.execute(select(Control.name, Control.value))}


def set_control(session: Session, name: str, value: Any) -> None:
    found = session.get(Control, name)
    if found is None:
        session.add(Control(name=name, value=value, set_at=utcnow()))
    else:
        found.value, found.set_at = value, utcnow()


def clear_controls(session: Session) -> int:
    return int(session.execute(delete(Control)).rowcount)  # type: ignore[attr-defined]
