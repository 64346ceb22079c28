"""Submitting work: new jobs and batches, idempotently. Used by ``annotate``, the API and
the benchmarks alike.

Every job has an idempotency key, unique in the table: the same request under the same
configuration is the same job, so submitting it again finds the job instead of making a
second one. A batch has a key too (an ``annotate`` run's source and configuration, or an
API client's ``Idempotency-Key``). Nothing here commits: the caller's transaction does,
and only then is the work sent on (``common.pipeline.dispatch``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from sqlalchemy import Table, insert, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from common.config import Method
from common.contracts import CancelReason, JobStatus
from common.errors import IdempotencyConflict, NotFound
from common.store import arrays, budgets, cancels
from common.store.db import is_postgres
from common.store.ids import client_job_key, idempotency_key, new_id, scope
from common.store.new_jobs import (
    NewItem,
    add_job,
    insert_jobs,
    item_key,
    job_row,
    jobs_by_key,
    next_position,
    waiting_status,
)
from common.store.tables import Batch, BatchItem, Job, utcnow

Result = TypeVar("Result")
log = logging.getLogger(__name__)

# A chunk's batch rows in one statement (``common.store.arrays``).
_ITEM_COLUMNS = ("batch_id", "position", "item_id", "expected", "split", "category", "job_id")
_ITEMS = cast(Table, BatchItem.__table__)
_UNNESTED_ITEMS = text(arrays.insert_from(_ITEMS, _ITEM_COLUMNS))


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


@dataclass
class Held:
    """What a batch held before this run and which of those rows this run has matched.

    ``before``: the rows at positions below it are from earlier runs (None: every row
    of the batch; 0: a new batch, nothing is looked up). ``matched`` marks, by position,
    the held rows an item of this run has taken already, so a corpus submitted in
    chunks matches each held row once, in corpus order, whichever chunk its id is in."""

    before: int | None = None
    matched: bytearray = field(default_factory=bytearray)

    def take(self, position: int) -> None:
        byte, bit = divmod(position, 8)
        if byte >= len(self.matched):
            self.matched.extend(bytes(byte + 1 - len(self.matched)))
        self.matched[byte] |= 1 << bit

    def taken(self, position: int) -> bool:
        byte, bit = divmod(position, 8)
        return byte < len(self.matched) and bool(self.matched[byte] >> bit & 1)


class Statistics:
    """Keeps the planner's statistics of the job tables true while a bulk submission
    grows them: ``ANALYZE`` (PostgreSQL) once this run has added ``first`` jobs, and each
    time it has doubled them since.

    A table loaded faster than autovacuum analyzes it (about a minute) is planned as if
    it were nearly empty: a claim of 32 jobs by id then reads every waiting job through
    the status index (15 ms a claim at 20,000 waiting, growing with the backlog;
    docs/benchmarks.md). A database user who does not own the tables gets a warning from
    PostgreSQL and nothing analyzed (autovacuum does it later); a table locked by
    maintenance (a VACUUM, an index being built) is skipped this time, never waited for.
    """

    SHARE = 0.1

    def __init__(self, first: int = 1000) -> None:
        self.next_at = first

    def grown(self, sessions: Any, jobs_added: int) -> bool:
        """Analyze if ``jobs_added`` (this run's, so far) calls for it; whether it did.
        Not where they are under ``SHARE`` of the rows the statistics already count: a
        thousand rows added to a million change no plan, and an ``ANALYZE`` of a big
        table (~0.3 s at a million jobs) would cost a small submission more than its rows
        (``speceyes bench scale``)."""
        if jobs_added < self.next_at:
            return False
        self.next_at = 2 * jobs_added
        try:
            with sessions.begin() as session:
                if not is_postgres(session):
                    return False
                counted = session.scalar(
                    text("SELECT reltuples FROM pg_class WHERE oid = 'jobs'::regclass")
                )
                if counted is not None and jobs_added < self.SHARE * float(counted):
                    return False
                session.execute(text("SET LOCAL lock_timeout = '1s'"))
                session.execute(text("ANALYZE jobs, batch_items"))
        except DBAPIError as exc:  # (locked, or the store went away: the next doubling)
            log.info("the job tables were not analyzed after a bulk load: %s", exc.orig)
            return False
        return True


def submit_items(
    session: Session,
    batch: Batch,
    items: Sequence[NewItem],
    config_key: str,
    method: Method = "speceyes",
    *,
    held: Held | None = None,
    created_jobs: list[tuple[str, str]] | None = None,
) -> tuple[int, int]:
    """Add ``items`` to ``batch``; each gets the job its key names, created if new.

    Each item takes the first row the batch already holds with its ``item_id`` that no
    earlier item took (``held``), and keeps it: submitting the same corpus again adds
    nothing, and a grown corpus adds only its new rows (at the end). But a held row
    whose item now reads differently (its image's bytes were replaced, a broken file was
    mended, its question is another) is pointed at the job of its new key, so its
    answer is never one about other pixels; a row whose file is broken now (gone for a
    while) keeps the answer it has. A re-pointed row's old job, held by no row now, ends
    (cancelled, ``superseded``: a worker would spend model time on it for no one). An
    item no held row is left for is a new row. A
    broken item (``error``) becomes a failed job. ``method`` is how new jobs are
    answered (``add_job``). Rows and jobs are written in bulk. ``created_jobs``
    collects (id, status) of each job created. Returns (jobs created, items added).
    """
    held = held if held is not None else Held()
    keys = [item_key(batch, item, config_key) for item in items]
    candidates: dict[str, list[tuple[BatchItem, str]]] = {}
    if held.before != 0:
        for row, key in sorted(
            _held_rows(session, batch.id, items, held.before), key=lambda found: found[0].position
        ):
            if not held.taken(row.position):
                candidates.setdefault(row.item_id, []).append((row, key))
    fresh: list[tuple[NewItem, str]] = []
    changed: list[tuple[NewItem, str, BatchItem]] = []
    for item, key in zip(items, keys, strict=True):
        waiting = candidates.get(item.item_id)
        if not waiting:
            fresh.append((item, key))
            continue
        row, held_key = waiting.pop(0)
        held.take(row.position)
        if item.error is None and held_key != key:
            changed.append((item, key, row))
    # Jobs first (items point at them), each inserted unless its key names one already:
    # the unique index decides, in the same statement, with no lookup that the planner
    # may turn into a scan of a table that grew since it was last analyzed. Only the
    # keys found taken are then read.
    now = utcnow()
    proposed: dict[str, dict[str, Any]] = {}
    for item, key in [*fresh, *((item, key) for item, key, _ in changed)]:
        if key not in proposed:
            proposed[key] = job_row(item, key, batch.tenant, method, now)
    inserted = insert_jobs(session, list(proposed.values()))
    new_jobs = [job for key, job in proposed.items() if key in inserted]
    existing = {key: job["id"] for key, job in proposed.items() if key in inserted}
    existing.update(jobs_by_key(session, set(proposed) - inserted))
    if created_jobs is not None:
        created_jobs.extend((job["id"], job["status"]) for job in new_jobs)
    superseded = {row.job_id for _, _, row in changed}
    for item, key, row in changed:
        row.job_id = existing[key]
        row.expected, row.split, row.category = item.expected, item.split, item.category
    if superseded:
        session.flush()
        _end_unheld(session, superseded - set(existing.values()))
    first_position = next_position(session, batch.id)
    new_rows = [
        {
            "batch_id": batch.id,
            "position": position,
            "item_id": item.item_id,
            "expected": item.expected,
            "split": item.split,
            "category": item.category,
            "job_id": existing[key],
        }
        for position, (item, key) in enumerate(fresh, first_position)
    ]
    if new_rows and is_postgres(session):
        session.execute(_UNNESTED_ITEMS, arrays.as_arrays(_ITEMS, new_rows, _ITEM_COLUMNS))
    elif new_rows:
        session.execute(insert(BatchItem), new_rows)
    session.flush()
    return len(new_jobs), len(fresh)


def _end_unheld(session: Session, job_ids: set[str]) -> None:
    """Cancel those of ``job_ids`` no batch row holds (a job two batches share goes on
    for the other; one that finished keeps its result)."""
    held = set(session.scalars(select(BatchItem.job_id).where(BatchItem.job_id.in_(job_ids))))
    if job_ids - held:
        cancels.cancel(session, sorted(job_ids - held), CancelReason.SUPERSEDED)


def _held_rows(
    session: Session, batch_id: str, items: Sequence[NewItem], held_before: int | None
) -> list[Any]:
    """The batch's rows (with their jobs' keys) that have the ids of ``items``, at
    positions below ``held_before`` (None: any)."""
    ids = sorted({item.item_id for item in items})
    rows: list[Any] = []
    for start in range(0, len(ids), 500):
        query = (
            select(BatchItem, Job.idempotency_key)
            .join(Job, Job.id == BatchItem.job_id)
            .where(BatchItem.batch_id == batch_id, BatchItem.item_id.in_(ids[start : start + 500]))
        )
        if held_before is not None:
            query = query.where(BatchItem.position < held_before)
        rows.extend(session.execute(query).all())
    return rows


def submit_job(
    session: Session,
    item: NewItem,
    *,
    client_key: str | None,
    batch_id: str | None,
    tenant: str | None = None,
    method: Method = "speceyes",
    callback_url: str | None = None,
) -> SubmittedJob:
    """One job from a client (or the one its ``client_key`` already names in ``tenant``).

    The same key with another image, question or options is an ``IdempotencyConflict``.
    With ``batch_id`` the new job is appended to that batch (``NotFound`` if none, or if
    it is another tenant's). A job sent alone announces its end (``job.finished``, to
    ``callback_url`` too where it names one: common.store.webhooks); one found again keeps
    the callback it was made with.
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
    # (one added to a batch is told of by its batch)
    alone = batch_id is None
    job_id = add_job(session, item, key, tenant, method, announces=alone, callback_url=callback_url)
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
    budget: tuple[float, int | None] | None = None,
    callback_url: str | None = None,
    own_jobs: bool = False,
) -> SubmittedBatch:
    """A client's batch of jobs (or the one its ``client_key`` already names in ``tenant``).
    Its jobs are the tenant's own: the same request from two tenants is two jobs.
    ``budget``: (max_failure_rate, budget_after), a failure budget (``budgets``); jobs
    that fail at intake count against it at once. ``callback_url``: where its events go
    (common.store.webhooks), besides the tenant's endpoints. ``own_jobs``: its jobs are
    its own, never one another batch holds (an OpenAI batch runs every request it has)."""
    if client_key:
        batch_key = idempotency_key("client-batch", client_key, *scope(tenant))
    else:
        batch_key = new_id()
    config = {"method": method} if method != "speceyes" else {}  # (the report reads it)
    batch, created = get_or_create_batch(
        session, key=batch_key, name=name, source="api", config=config, tenant=tenant
    )
    if created:
        if budget is not None:
            batch.max_failure_rate, batch.budget_after = budget
        batch.callback_url = callback_url
        # (another method answers otherwise: another job; the funnel's keys as they were)
        method_part = [method] if method != "speceyes" else []
        key = idempotency_key("api", *scope(tenant), *method_part)
        if own_jobs:
            key = idempotency_key(key, batch.id)
        made: list[tuple[str, str]] = []
        submit_items(session, batch, items, config_key=key, method=method, created_jobs=made)
        budgets.check(session, [job_id for job_id, status in made if status == JobStatus.FAILED])
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
