"""Reading and writing jobs. Every write that records an outcome is idempotent.

A worker may be handed the same job twice (a redelivered message, a restarted run), so
each state change is a conditional UPDATE that names the state it expects: recording a
fast-stage outcome needs ``running`` in stage ``fast``; recording an agent outcome needs
``running`` in stage ``agent``. A second recording of the same job finds the state
already changed and touches nothing, so a job has exactly one result.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast

from sqlalchemy import Table, and_, bindparam, func, or_, select, update
from sqlalchemy.orm import Session

from common.backends.base import Query
from common.config import GateSettings, ImageLimits
from common.funnel import Accepted, AgentOutcome, Failed, FastOutcome, prepare_query
from common.store.tables import (
    AGENT,
    DEFERRED,
    DONE,
    FAILED,
    FAST,
    QUEUED,
    RUNNING,
    Batch,
    BatchItem,
    Job,
    utcnow,
)


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


@dataclass(frozen=True)
class Ticket:
    """What a stage needs to work on a job: small, no pixels."""

    job_id: str
    image_path: str | None
    image_hash: str | None
    question: str
    options: list[str] | None
    attempts: int = 1  # this claim included

    def load(self, limits: ImageLimits) -> Query | Failed:
        """The job's image and question as a ``Query``, or the job failed with the reason
        (missing, unreadable, corrupt or changed since it was submitted)."""
        if self.image_path is None:
            return Failed(self.job_id, "image_missing", "the job has no image")
        return prepare_query(
            self.job_id, self.image_path, self.question, self.options, limits,
            expected_hash=self.image_hash,
        )  # fmt: skip


@dataclass
class BatchCounts:
    items: int = 0
    jobs: int = 0
    by_status: Counter[str] = field(default_factory=Counter)
    by_answerer: Counter[str] = field(default_factory=Counter)
    by_defer_reason: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)  # error code -> jobs
    screened: int = 0
    screened_tool_free: int = 0
    speculated: int = 0
    accepted: int = 0

    @property
    def finished(self) -> int:
        return self.by_status[DONE] + self.by_status[FAILED]

    @property
    def beta(self) -> float | None:
        """Share of screened jobs the screen called tool-free."""
        return self.screened_tool_free / self.screened if self.screened else None

    @property
    def alpha(self) -> float | None:
        """Share of speculated jobs the gate accepted."""
        return self.accepted / self.speculated if self.speculated else None


def idempotency_key(*parts: Any) -> str:
    """A stable key from JSON-able parts (content hash, question, options, settings)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def new_id() -> str:
    return uuid.uuid4().hex


def get_or_create_batch(
    session: Session, *, key: str, name: str, source: str, config: dict[str, Any]
) -> tuple[Batch, bool]:
    """The batch with ``key``, created if new. Returns (batch, created)."""
    batch = session.scalar(select(Batch).where(Batch.key == key))
    if batch is not None:
        return batch, False
    batch = Batch(id=new_id(), key=key, name=name, source=source, config=config)
    session.add(batch)
    session.flush()
    return batch, True


def submit_items(
    session: Session, batch: Batch, items: Sequence[NewItem], config_key: str
) -> tuple[int, int]:
    """Add ``items`` to ``batch``; each gets the job its key names, created if new.

    Items whose ``item_id`` the batch already holds are skipped, so submitting the same
    corpus again adds nothing and a grown corpus adds only its new rows (at the end).
    A broken item (``error``) becomes a failed job. Returns (jobs created, items added).
    """
    known = set(session.scalars(select(BatchItem.item_id).where(BatchItem.batch_id == batch.id)))
    first_position = next_position(session, batch.id)
    fresh = [item for item in items if item.item_id not in known]
    keys = [_item_key(batch, item, config_key) for item in fresh]
    existing = _jobs_by_key(session, set(keys))
    created = 0
    for item, key in zip(fresh, keys, strict=True):
        if key not in existing:
            existing[key] = add_job(session, item, key)
            created += 1
    session.flush()  # jobs first: items point at them (no ORM relationship orders this)
    for position, (item, key) in enumerate(zip(fresh, keys, strict=True), first_position):
        item_row = BatchItem(
            batch_id=batch.id, position=position, item_id=item.item_id, expected=item.expected
        )
        item_row.job_id = existing[key]
        session.add(item_row)
    session.flush()
    return created, len(fresh)


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
    return idempotency_key(item.image_hash, item.question, item.options, config_key)


def add_job(session: Session, item: NewItem, key: str) -> str:
    job = Job(
        id=new_id(),
        idempotency_key=key,
        image_path=item.image_path,
        image_hash=item.image_hash,
        question=item.question,
        options=item.options,
        status=QUEUED,
        stage=FAST,
        attempts=0,
    )
    if item.error is not None:
        job.status, (job.error_code, job.error_message) = FAILED, item.error
        job.finished_at = utcnow()
    session.add(job)
    return job.id


def _update() -> Any:
    """An UPDATE of jobs that leaves loaded objects alone (no ORM bookkeeping per row):
    every write here names the row state it expects, and readers load afresh."""
    return update(Job).execution_options(synchronize_session=False)


def _batch_jobs(batch_id: str) -> Any:
    return select(BatchItem.job_id).where(BatchItem.batch_id == batch_id)


def release_running(session: Session, batch_id: str | None = None) -> int:
    """Put interrupted jobs back: stage fast -> queued, stage agent -> deferred."""
    released = 0
    for stage, status in ((FAST, QUEUED), (AGENT, DEFERRED)):
        statement = _update().where(Job.status == RUNNING, Job.stage == stage)
        if batch_id is not None:
            statement = statement.where(Job.id.in_(_batch_jobs(batch_id)))
        released += session.execute(statement.values(status=status)).rowcount  # type: ignore[attr-defined]
    return released


def claim(session: Session, status: str, limit: int, batch_id: str | None = None) -> list[Ticket]:
    """Move up to ``limit`` jobs from ``status`` (queued/deferred) to running, oldest first."""
    stage = FAST if status == QUEUED else AGENT
    query = select(Job.id).where(Job.status == status).order_by(Job.created_at, Job.id).limit(limit)
    if batch_id is not None:
        query = query.where(Job.id.in_(_batch_jobs(batch_id)))
    ids = list(session.scalars(query.with_for_update(skip_locked=True)))
    if not ids:
        return []
    started = {"fast_started_at" if stage == FAST else "agent_started_at": utcnow()}
    session.execute(
        _update()
        .where(Job.id.in_(ids), Job.status == status)
        .values(status=RUNNING, stage=stage, attempts=Job.attempts + 1, **started)
    )
    rows = session.scalars(
        select(Job).where(Job.id.in_(ids), Job.status == RUNNING, Job.stage == stage)
    )
    return [Ticket(j.id, j.image_path, j.image_hash, j.question, j.options) for j in rows]


def claim_ids(
    session: Session,
    job_ids: Sequence[str],
    stage: str,
    *,
    stale_after_s: float | None,
    takeover: bool = False,
) -> list[Ticket]:
    """Claim the named jobs for ``stage`` (a message carried their ids).

    A job is claimed when it waits for the stage (``queued`` for fast, ``deferred`` for
    agent), or when it has been ``running`` in the stage for over ``stale_after_s`` (the
    worker that held it died and its message came back; ``None``: never), or at once with
    ``takeover``
    (the message was sent again by the worker that held the job and could not finish or
    release it). Jobs that are finished, waiting for the other stage, or running elsewhere
    right now are left alone. Each claim counts one attempt; the tickets carry the count.
    """
    waiting = QUEUED if stage == FAST else DEFERRED
    started = Job.fast_started_at if stage == FAST else Job.agent_started_at
    now = utcnow()
    claimable: Any = Job.status == waiting
    if takeover or stale_after_s is not None:
        stale = now - timedelta(seconds=0 if takeover else stale_after_s or 0)
        held = and_(Job.status == RUNNING, Job.stage == stage, started <= stale)
        claimable = or_(claimable, held)
    # One UPDATE ... RETURNING: a row another transaction is claiming right now is waited
    # for, then re-checked, so two deliveries of one job never both claim it.
    statement = (
        _update()
        .where(Job.id.in_(list(job_ids)), claimable)
        .values(status=RUNNING, stage=stage, attempts=Job.attempts + 1, **{started.key: now})
        .returning(*_TICKET_COLUMNS, Job.created_at)
    )
    rows = sorted(session.execute(statement).all(), key=lambda row: (row.created_at, row.id))
    return [Ticket(*row[:6]) for row in rows]


_TICKET_COLUMNS = (Job.id, Job.image_path, Job.image_hash, Job.question, Job.options, Job.attempts)


def statuses(session: Session, job_ids: Sequence[str]) -> dict[str, str]:
    """Job id -> status, for the ids that exist."""
    query = select(Job.id, Job.status).where(Job.id.in_(list(job_ids)))
    return {job_id: status for job_id, status in session.execute(query)}


def release_ids(
    session: Session, job_ids: Sequence[str], stage: str, *, count_attempt: bool = True
) -> int:
    """Put claimed jobs back to wait for ``stage`` again (a retry, not a result).

    ``count_attempt=False`` gives the claim's attempt back: the job did nothing wrong
    (a model server was down), so the outage does not use up its attempts.
    """
    waiting = QUEUED if stage == FAST else DEFERRED
    values: dict[str, Any] = {"status": waiting}
    if not count_attempt:
        values["attempts"] = Job.attempts - 1
    statement = _update().where(Job.id.in_(list(job_ids)), Job.status == RUNNING)
    result = session.execute(statement.where(Job.stage == stage).values(**values))
    return int(result.rowcount)  # type: ignore[attr-defined]


def fail_running(session: Session, job_id: str, stage: str, code: str, message: str) -> bool:
    """Fail a job this worker holds (over its attempt limit, or an error of its own)."""
    statement = _running(job_id, stage).values(
        status=FAILED, error_code=code, error_message=message, finished_at=utcnow()
    )
    return bool(session.execute(statement).rowcount)  # type: ignore[attr-defined]


def _running(job_id: str, stage: str) -> Any:
    return _update().where(Job.id == job_id, Job.status == RUNNING, Job.stage == stage)


def record_fast(session: Session, outcomes: Iterable[FastOutcome], gate: GateSettings) -> int:
    """Record a fast-stage batch's outcomes; returns how many rows changed.

    Outcomes that write the same columns go in one executemany (one round trip per kind
    of outcome on PostgreSQL, not one per job).
    """
    now = utcnow()
    gate_used = {"mode": gate.mode, "top_k": gate.top_k, "threshold": gate.threshold}
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for outcome in outcomes:
        values = _fast_values(outcome, gate_used, now)
        groups.setdefault(tuple(sorted(values)), []).append({"job_id": outcome.job_id, **values})
    table = cast(Table, Job.__table__)
    changed = 0
    for columns, rows in groups.items():
        statement = (
            update(table)
            .where(table.c.id == bindparam("job_id"))
            .where(table.c.status == RUNNING, table.c.stage == FAST)
            .values({column: bindparam(column) for column in columns})
        )
        result = session.connection().execute(statement, rows)
        changed += max(0, result.rowcount)
    return changed


def _fast_values(outcome: FastOutcome, gate_used: dict[str, Any], now: Any) -> dict[str, Any]:
    if isinstance(outcome, Failed):
        return {
            "status": FAILED,
            "error_code": outcome.code,
            "error_message": outcome.message,
            "finished_at": now,
        }
    common = {"gated_at": now, **_screen_values(outcome.screen)}
    if isinstance(outcome, Accepted):
        return {
            "status": DONE,
            "answered_by": "small",
            "final_answer": outcome.answer,
            "small_answer": outcome.answer,
            "confidence": outcome.confidence,
            "token_scores": outcome.token_scores,
            "gate": gate_used,
            "finished_at": now,
            **common,
        }
    return {
        "status": DEFERRED,
        "stage": AGENT,
        "attempts": 0,  # attempts count per stage
        "defer_reason": outcome.reason,
        "small_answer": outcome.small_answer,
        "confidence": outcome.confidence,
        "gate": gate_used if outcome.confidence is not None else None,
        "error_message": outcome.detail or None,
        **common,
    }


def _screen_values(screen: Any) -> dict[str, Any]:
    if screen is None:
        return {}
    return {"screen_needs_tools": screen.needs_tools, "screen_text": screen.raw_text}


def record_agent(session: Session, outcome: AgentOutcome | Failed) -> bool:
    """Record a trajectory's end (or a job that failed before it began)."""
    now = utcnow()
    values: dict[str, Any]
    if isinstance(outcome, Failed):
        values = {"status": FAILED, "error_code": outcome.code, "error_message": outcome.message}
    elif outcome.answer is not None:
        values = {
            "status": DONE,
            "answered_by": "large",
            "final_answer": outcome.answer,
            "trajectory": outcome.trajectory.to_dict(),
            "error_message": None,
        }
    else:
        values = {
            "status": FAILED,
            "error_code": outcome.error_code,
            "error_message": outcome.error,
            "trajectory": outcome.trajectory.to_dict(),
        }
    result = session.execute(_running(outcome.job_id, AGENT).values(finished_at=now, **values))
    return bool(result.rowcount)  # type: ignore[attr-defined]


def job_ids(session: Session, batch_id: str, status: str) -> list[str]:
    """The batch's jobs in ``status``, oldest first."""
    query = select(Job.id).where(Job.status == status, Job.id.in_(_batch_jobs(batch_id)))
    return list(session.scalars(query.order_by(Job.created_at, Job.id)))


def count_status(session: Session, status: str, batch_id: str) -> int:
    query = select(func.count()).select_from(Job).where(Job.status == status)
    return session.scalar(query.where(Job.id.in_(_batch_jobs(batch_id)))) or 0


def batch_counts(session: Session, batch_id: str) -> BatchCounts:
    """Counts over a batch's distinct jobs, for progress bars and summaries."""
    counts = BatchCounts()
    counts.items = (
        session.scalar(
            select(func.count()).select_from(BatchItem).where(BatchItem.batch_id == batch_id)
        )
        or 0
    )
    jobs = select(Job).where(Job.id.in_(_batch_jobs(batch_id))).subquery()
    columns = (
        jobs.c.status,
        jobs.c.answered_by,
        jobs.c.defer_reason,
        jobs.c.error_code,
        jobs.c.screen_needs_tools,
        jobs.c.small_answer.is_not(None),
    )
    rows = session.execute(select(*columns, func.count()).group_by(*columns))
    for status, answerer, reason, code, needs_tools, speculated, n in rows:
        counts.jobs += n
        counts.by_status[status] += n
        if answerer:
            counts.by_answerer[answerer] += n
        if reason:
            counts.by_defer_reason[reason] += n
        if status == FAILED:
            counts.failures[code or "unknown"] += n
        if needs_tools is not None:
            counts.screened += n
            counts.screened_tool_free += 0 if needs_tools else n
        if speculated:
            counts.speculated += n
            counts.accepted += n if answerer == "small" else 0
    return counts


def get_job(session: Session, job_id: str) -> Job | None:
    return session.get(Job, job_id)


def find_batch(session: Session, id_or_name: str) -> Batch | None:
    """A batch by id, else the newest batch of that name."""
    batch = session.get(Batch, id_or_name)
    if batch is not None:
        return batch
    query = select(Batch).where(Batch.name == id_or_name).order_by(Batch.created_at.desc())
    return session.scalars(query.limit(1)).first()


def batch_results(session: Session, batch_id: str) -> Iterator[tuple[BatchItem, Job]]:
    """A batch's rows in order, each with its job."""
    query = (
        select(BatchItem, Job)
        .join(Job, Job.id == BatchItem.job_id)
        .where(BatchItem.batch_id == batch_id)
        .order_by(BatchItem.position)
    )
    for item, job in session.execute(query.execution_options(yield_per=500)):  # noqa: UP028
        yield item, job


def batch_accuracy(session: Session, batch_id: str) -> tuple[int, int]:
    """(rows with a known answer that are finished, of those answered right)."""
    from common.scoring import is_correct

    scored = correct = 0
    for item, job in batch_results(session, batch_id):
        if item.expected is None or job.status not in (DONE, FAILED):
            continue
        scored += 1
        correct += is_correct(job.final_answer, item.expected, job.options)
    return scored, correct
