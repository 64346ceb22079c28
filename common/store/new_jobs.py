"""A new job's row, and writing new jobs idempotently: in bulk, the unique index on
the idempotency key deciding which are new (``insert_jobs``), or one at a time
(``add_job``). A broken item's job is written failed, with its reason."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, func, insert, select, text
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from common.config import Method, RequestLimits
from common.contracts import DeferReason, JobStatus, Priority, SourceRow, Stage
from common.limits import printable
from common.store import arrays
from common.store.db import is_postgres
from common.store.ids import idempotency_key, new_id
from common.store.tables import Batch, BatchItem, Job, utcnow


@dataclass(frozen=True)
class NewItem:
    """One row of a batch to submit. ``error`` makes it a job that is failed at once."""

    position: int
    item_id: str
    question: str
    options: list[str] | None = None
    image_path: str | None = None
    image_hash: str | None = None
    error: tuple[str, str] | None = None  # (code, message)
    expected: str | None = None  # the known right answer, for accuracy
    split: str | None = None  # a benchmark row's split ("vstar/direct_attributes", ...)
    category: str | None = None
    shown_path: str | None = None  # (``SourceRow.shown_path``)
    priority: int = Priority.NORMAL.rank  # (``Priority.rank``) a new job's; a found job keeps its


def storable_item(row: SourceRow, limits: RequestLimits) -> NewItem:
    """The row as a ``NewItem`` whose texts the store can keep (for a row that may be
    refused: its failed job still shows what it held)."""

    def keep(value: str | None, limit: int) -> str | None:
        return None if value is None else printable(value, limit)

    options = row.options[: limits.max_options] if row.options else None
    return NewItem(
        row.position,
        printable(row.item_id, limits.max_id_chars),
        printable(row.question, limits.max_question_chars),
        [printable(option, limits.max_option_chars) for option in options] if options else None,
        keep(row.image_path, limits.max_id_chars),
        expected=keep(row.expected, limits.max_id_chars),
        split=keep(row.split, 100),  # (the columns' width)
        category=keep(row.category, 100),
        shown_path=keep(row.shown_path, limits.max_id_chars),
    )


def waiting_status(method: Method) -> JobStatus:
    """What a new job waits as: ``queued`` for the funnel; ``deferred`` (to the agent
    stage, reason ``specreason``) for SpecReason, which skips phases I-III."""
    return JobStatus.DEFERRED if method == "specreason" else JobStatus.QUEUED


def add_job(
    session: Session,
    item: NewItem,
    key: str,
    tenant: str | None = None,
    method: Method = "speceyes",
    **columns: Any,
) -> str:
    """Add one job; ``columns``: others of its row (a job sent alone's callback)."""
    row = job_row(item, key, tenant, method, utcnow()) | columns
    session.add(Job(**row))
    return str(row["id"])


def job_row(
    item: NewItem, key: str, tenant: str | None, method: Method, now: datetime
) -> dict[str, Any]:
    """A new job's columns. A broken item's job is failed at once: it finishes as it is
    created (one clock reading, ``now``)."""
    failed = item.error is not None
    return {
        "created_at": now,
        "tenant": tenant,
        "id": new_id(),
        "idempotency_key": key,
        "image_path": item.image_path,
        "image_hash": item.image_hash,
        "question": item.question,
        "options": item.options,
        "shown_path": item.shown_path,
        "status": JobStatus.FAILED if failed else waiting_status(method),
        "stage": Stage.AGENT if method == "specreason" else Stage.FAST,
        "defer_reason": DeferReason.SPECREASON if method == "specreason" else None,
        "priority": item.priority,
        "attempts": 0,
        "error_code": item.error[0] if item.error else None,
        "error_message": item.error[1] if item.error else None,
        "finished_at": now if failed else None,
        "sent_at": None if failed else now,  # (its message goes out with this commit)
    }


_JOB_COLUMNS = (
    "created_at",
    "tenant",
    "id",
    "idempotency_key",
    "image_path",
    "image_hash",
    "question",
    "options",
    "shown_path",
    "status",
    "stage",
    "defer_reason",
    "priority",
    "attempts",
    "error_code",
    "error_message",
    "finished_at",
    "sent_at",
)
_JOBS = cast(Table, Job.__table__)
_UNNESTED_INSERT = text(
    arrays.insert_from(_JOBS, _JOB_COLUMNS)
    + " ON CONFLICT (idempotency_key) DO NOTHING RETURNING idempotency_key"
)


def insert_jobs(session: Session, rows: list[dict[str, Any]]) -> set[str]:
    """Insert the job ``rows`` whose idempotency keys are free; the keys inserted. The
    unique index decides (ON CONFLICT DO NOTHING), in the statement that inserts: no
    lookup first, which PostgreSQL may plan as a scan of a table that grew since it
    was last analyzed (a first bulk load)."""
    if not rows:
        return set()
    if is_postgres(session):
        columns = arrays.as_arrays(_JOBS, rows, _JOB_COLUMNS)
        return set(session.scalars(_UNNESTED_INSERT, columns))
    if session.get_bind().dialect.name == "sqlite":
        statement = (
            sqlite_insert(Job)
            .on_conflict_do_nothing(index_elements=[Job.idempotency_key])
            .returning(Job.idempotency_key)
        )
        return set(session.scalars(statement, rows))
    taken = jobs_by_key(session, {row["idempotency_key"] for row in rows})  # (another one)
    free = [row for row in rows if row["idempotency_key"] not in taken]
    if free:
        session.execute(insert(Job), free)
    return {row["idempotency_key"] for row in free}


def jobs_by_key(session: Session, keys: set[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    ordered = sorted(keys)
    for start in range(0, len(ordered), 500):
        query = select(Job.idempotency_key, Job.id).where(
            Job.idempotency_key.in_(ordered[start : start + 500])
        )
        found.update(dict(session.execute(query).all()))
    return found


def next_position(session: Session, batch_id: str) -> int:
    """The position a row appended to the batch gets."""
    last = session.scalar(
        select(func.max(BatchItem.position)).where(BatchItem.batch_id == batch_id)
    )
    return 0 if last is None else last + 1


def item_key(batch: Batch, item: NewItem, config_key: str) -> str:
    if item.error is not None or item.image_hash is None:
        return idempotency_key("broken", batch.key, item.item_id, item.error)
    if item.shown_path is not None:  # (Thyme is shown it: another text, another job)
        key = (item.image_hash, item.question, item.options, config_key, item.shown_path)
        return idempotency_key(*key)
    return idempotency_key(item.image_hash, item.question, item.options, config_key)
