"""Submitting work: new jobs and batches, idempotently. Used by ``annotate``, the API and
the benchmarks alike.

Every job has an idempotency key, unique in the table: the same request under the same
configuration is the same job, so submitting it again finds the job instead of making a
second one. A batch has a key too (an ``annotate`` run's source and configuration, or an
API client's ``Idempotency-Key``). Nothing here commits: the caller's transaction does,
and only then is the work sent on (``common.dispatch``).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from common.config import Method, RequestLimits
from common.contracts import DeferReason, JobStatus, SourceRow, Stage
from common.errors import IdempotencyConflict, NotFound
from common.limits import printable
from common.store.tables import Batch, BatchItem, Job, utcnow

Result = TypeVar("Result")


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


@dataclass(frozen=True)
class SubmittedJob:
    id: str
    status: str
    created: bool  # False: the idempotency key named an existing job


@dataclass(frozen=True)
class SubmittedBatch:
    id: str
    job_ids: list[str]  # in row order
    created: bool  # False: the key named an existing batch
    queued: list[str]  # jobs this submission created that wait for a stage


def idempotency_key(*parts: Any) -> str:
    """A stable key from JSON-able parts (content hash, question, options, settings)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def new_id() -> str:
    return uuid.uuid4().hex


def client_job_key(client_key: str, tenant: str | None) -> str:
    """The job key of a client's idempotency key: one namespace per tenant."""
    return idempotency_key("client", client_key, *_scope(tenant))


def _scope(tenant: str | None) -> tuple[str, ...]:
    # no tenant (keys off, or rows from before tenants): the key as it always was
    return () if tenant is None else (f"tenant:{tenant}",)


def get_or_create_batch(
    session: Session,
    *,
    key: str,
    name: str,
    source: str,
    config: dict[str, Any],
    tenant: str | None = None,
) -> tuple[Batch, bool]:
    """The batch with ``key``, created if new. Returns (batch, created)."""
    batch = session.scalar(select(Batch).where(Batch.key == key))
    if batch is not None:
        return batch, False
    batch = Batch(id=new_id(), key=key, name=name, source=source, config=config, tenant=tenant)
    session.add(batch)
    session.flush()
    return batch, True


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


def submit_items(
    session: Session,
    batch: Batch,
    items: Sequence[NewItem],
    config_key: str,
    method: Method = "speceyes",
) -> tuple[int, int]:
    """Add ``items`` to ``batch``; each gets the job its key names, created if new.

    An item whose ``item_id`` the batch already holds keeps its row: submitting the same
    corpus again adds nothing, and a grown corpus adds only its new rows (at the end).
    But a held row whose item now reads differently (its image's bytes were replaced, a
    broken file was mended) is pointed at the job of its new key, so its answer is never
    one about other pixels; a row whose file is broken now (gone for a while) keeps the
    answer it has. Only an id held once and submitted once is followed so: rows that
    share an id (several questions about one image) keep theirs. A broken item
    (``error``) becomes a failed job. ``method`` is how new jobs are answered (``add_job``).
    Returns (jobs created, items added).
    """
    held_rows = session.execute(
        select(BatchItem, Job.idempotency_key)
        .join(Job, Job.id == BatchItem.job_id)
        .where(BatchItem.batch_id == batch.id)
    ).all()
    held_ids = Counter(row.item_id for row, _ in held_rows)
    submitted_ids = Counter(item.item_id for item in items)
    held = {row.item_id: (row, key) for row, key in held_rows if held_ids[row.item_id] == 1}
    keys = [_item_key(batch, item, config_key) for item in items]
    fresh = [
        (item, key) for item, key in zip(items, keys, strict=True) if item.item_id not in held_ids
    ]
    changed = [
        (item, key)
        for item, key in zip(items, keys, strict=True)
        if item.item_id in held
        and submitted_ids[item.item_id] == 1
        and item.error is None
        and held[item.item_id][1] != key
    ]
    existing = _jobs_by_key(session, {key for _, key in fresh + changed})
    created = 0
    for item, key in fresh + changed:
        if key not in existing:
            existing[key] = add_job(session, item, key, batch.tenant, method)
            created += 1
    session.flush()  # jobs first: items point at them (no ORM relationship orders this)
    for item, key in changed:
        row = held[item.item_id][0]
        row.job_id = existing[key]
        row.expected, row.split, row.category = item.expected, item.split, item.category
    first_position = next_position(session, batch.id)
    for position, (item, key) in enumerate(fresh, first_position):
        item_row = BatchItem(
            batch_id=batch.id,
            position=position,
            item_id=item.item_id,
            expected=item.expected,
            split=item.split,
            category=item.category,
        )
        item_row.job_id = existing[key]
        session.add(item_row)
    session.flush()
    return created, len(fresh)


def submit_job(
    session: Session,
    item: NewItem,
    *,
    client_key: str | None,
    batch_id: str | None,
    tenant: str | None = None,
    method: Method = "speceyes",
) -> SubmittedJob:
    """One job from a client (or the one its ``client_key`` already names in ``tenant``).

    The same key with another image, question or options is an ``IdempotencyConflict``.
    With ``batch_id`` the new job is appended to that batch (``NotFound`` if none, or if
    it is another tenant's).
    """
    key = client_job_key(client_key, tenant) if client_key else new_id()
    existing = session.scalar(select(Job).where(Job.idempotency_key == key))
    if existing is not None:
        if (existing.image_hash, existing.question, existing.options) != (
            item.image_hash,
            item.question,
            item.options,
        ):
            raise IdempotencyConflict(
                "this idempotency key names a job with another image or question"
            )
        return SubmittedJob(existing.id, existing.status, created=False)
    if batch_id is not None:
        batch = session.get(Batch, batch_id)
        if batch is None or (tenant is not None and batch.tenant != tenant):
            raise NotFound(f"no batch {batch_id}", code="batch_not_found")
    job_id = add_job(session, item, key, tenant, method)
    if batch_id is not None:
        session.flush()
        session.add(
            BatchItem(
                batch_id=batch_id,
                position=next_position(session, batch_id),
                item_id=item.item_id or job_id,
                job_id=job_id,
                expected=item.expected,
            )
        )
    return SubmittedJob(job_id, waiting_status(method), created=True)


def submit_batch(
    session: Session,
    items: Sequence[NewItem],
    *,
    name: str,
    client_key: str | None,
    tenant: str | None = None,
    method: Method = "speceyes",
) -> SubmittedBatch:
    """A client's batch of jobs (or the one its ``client_key`` already names in ``tenant``).
    Its jobs are the tenant's own: the same request from two tenants is two jobs."""
    if client_key:
        batch_key = idempotency_key("client-batch", client_key, *_scope(tenant))
    else:
        batch_key = new_id()
    config = {"method": method} if method != "speceyes" else {}  # (the report reads it)
    batch, created = get_or_create_batch(
        session, key=batch_key, name=name, source="api", config=config, tenant=tenant
    )
    if created:
        # (another method answers otherwise: another job; the funnel's keys as they were)
        method_part = [method] if method != "speceyes" else []
        key = idempotency_key("api", *_scope(tenant), *method_part)
        submit_items(session, batch, items, config_key=key, method=method)
    rows = session.execute(
        select(BatchItem.job_id, Job.status)
        .join(Job, Job.id == BatchItem.job_id)
        .where(BatchItem.batch_id == batch.id)
        .order_by(BatchItem.position)
    ).all()
    waiting = (JobStatus.QUEUED, JobStatus.DEFERRED)
    queued = [job_id for job_id, status in rows if status in waiting] if created else []
    return SubmittedBatch(batch.id, [job_id for job_id, _ in rows], created, queued)


def resolving_races(work: Callable[[], Result]) -> Result:
    """Run ``work``, one whole transaction that may create rows under unique keys; if a
    concurrent one created the same key first (the database refuses ours), run it once
    more: it then finds that row and answers it, as for any repeated request."""
    try:
        return work()
    except IntegrityError:
        return work()


def next_position(session: Session, batch_id: str) -> int:
    """The position a row appended to the batch gets."""
    last = session.scalar(
        select(func.max(BatchItem.position)).where(BatchItem.batch_id == batch_id)
    )
    return 0 if last is None else last + 1


def _jobs_by_key(session: Session, keys: set[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    ordered = sorted(keys)
    for start in range(0, len(ordered), 500):
        query = select(Job.idempotency_key, Job.id).where(
            Job.idempotency_key.in_(ordered[start : start + 500])
        )
        found.update(dict(session.execute(query).all()))
    return found


def _item_key(batch: Batch, item: NewItem, config_key: str) -> str:
    if item.error is not None or item.image_hash is None:
        return idempotency_key("broken", batch.key, item.item_id, item.error)
    if item.shown_path is not None:  # (Thyme is shown it: another text, another job)
        key = (item.image_hash, item.question, item.options, config_key, item.shown_path)
        return idempotency_key(*key)
    return idempotency_key(item.image_hash, item.question, item.options, config_key)


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
) -> str:
    now = utcnow()  # one clock reading: a job failed at once finishes as it is created
    job = Job(
        created_at=now,
        tenant=tenant,
        id=new_id(),
        idempotency_key=key,
        image_path=item.image_path,
        image_hash=item.image_hash,
        question=item.question,
        options=item.options,
        shown_path=item.shown_path,
        status=waiting_status(method),
        stage=Stage.AGENT if method == "specreason" else Stage.FAST,
        defer_reason=DeferReason.SPECREASON if method == "specreason" else None,
        attempts=0,
    )
    if item.error is not None:
        job.status, (job.error_code, job.error_message) = JobStatus.FAILED, item.error
        job.finished_at = now
    session.add(job)
    return job.id
