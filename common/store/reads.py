"""Read models of the job store: progress counts, results in order, single jobs."""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session

from common.contracts import FINISHED, WAITING_FOR, AnsweredBy, JobStatus, Priority, Stage
from common.errors import NotFound
from common.store import tallies
from common.store.tables import Batch, BatchItem, Job

AUDIT_DONE = "done"  # common.store.audits.DONE (which reads this module)


@dataclass
class BatchCounts:
    items: int = 0
    jobs: int = 0
    by_status: Counter[str] = field(default_factory=Counter)
    by_answerer: Counter[str] = field(default_factory=Counter)
    by_defer_reason: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)  # error code -> jobs
    cancellations: Counter[str] = field(default_factory=Counter)  # reason -> jobs
    screened: int = 0
    screened_tool_free: int = 0
    speculated: int = 0
    accepted: int = 0
    # when and how much: the pace, and what changes whenever results do
    first_started: datetime | None = None  # the first fast-stage claim
    last_finished: datetime | None = None
    reviewed: int = 0
    last_reviewed: datetime | None = None
    audited: int = 0  # accepted answers the online audit finished
    audit_agreed: int = 0
    verdicts: int = 0  # rows an LLM judge gave a verdict
    pending: int = 0  # changes of the kept counts not yet folded (common.store.tallies)

    @property
    def finished(self) -> int:
        return sum(self.by_status[status] for status in FINISHED)

    @property
    def beta(self) -> float | None:
        """Share of screened jobs the screen called tool-free."""
        return self.screened_tool_free / self.screened if self.screened else None

    @property
    def alpha(self) -> float | None:
        """Share of speculated jobs the gate accepted."""
        return self.accepted / self.speculated if self.speculated else None

    @property
    def pace(self) -> float | None:
        """Finished jobs a second, from the first claim to the last result."""
        if self.first_started is None or self.last_finished is None:
            return None
        seconds = (self.last_finished - self.first_started).total_seconds()
        return self.finished / seconds if seconds > 0 else None

    @property
    def version(self) -> tuple[Any, ...]:
        """Changes whenever a job of these finishes (again) or is reviewed."""
        return (self.finished, self.last_finished, self.reviewed, self.last_reviewed)

    @property
    def small_share(self) -> float:
        """Share of jobs the small model answered."""
        return self.by_answerer[AnsweredBy.SMALL] / self.jobs if self.jobs else 0.0


def batch_jobs(batch_id: str) -> Any:
    """A subquery of the batch's job ids."""
    return select(BatchItem.job_id).where(BatchItem.batch_id == batch_id)


def job_ids(session: Session, batch_id: str, status: str) -> list[str]:
    """The batch's jobs in ``status``, oldest first."""
    query = select(Job.id).where(Job.status == status, Job.id.in_(batch_jobs(batch_id)))
    return list(session.scalars(query.order_by(Job.created_at, Job.id)))


def count_status(session: Session, status: str, batch_id: str) -> int:
    query = select(func.count()).select_from(Job).where(Job.status == status)
    return session.scalar(query.where(Job.id.in_(batch_jobs(batch_id)))) or 0


def batch_counts(session: Session, batch_id: str) -> BatchCounts:
    """Counts over a batch's distinct jobs and its rows, for progress bars and summaries:
    from the tallies kept as they change (a few rows, whatever the batch's size)."""
    counts = tallied(session, batch_id)
    if counts.pending > tallies.FOLD_AT:
        tallies.fold_now(session, batch_id)
    return counts


def counts_of(session: Session, job_ids: Any) -> BatchCounts:
    """Counts over the jobs a subquery of ids names, in one pass over columns that one
    index of the jobs holds (``ix_jobs_summary``): a 100,000-job batch never reads its
    jobs' wide rows (trajectories, token scores) to be counted."""
    counts = BatchCounts()
    keys = (Job.status, Job.answered_by, Job.defer_reason, Job.error_code)
    figures = (
        func.count(),
        func.count(Job.screen_needs_tools),  # screened
        _tally(Job.screen_needs_tools.is_(False)),  # called tool-free
        func.count(Job.confidence),  # speculated: the small model answered, with its score
        _tally(Job.audit_status == AUDIT_DONE),
        _tally(and_(Job.audit_status == AUDIT_DONE, Job.audit_agrees.is_(True))),
        func.min(Job.fast_started_at),
        func.max(Job.finished_at),
        func.count(Job.reviewed_at),
        func.max(Job.reviewed_at),
    )
    rows = session.execute(select(*keys, *figures).where(Job.id.in_(job_ids)).group_by(*keys))
    for status, answerer, reason, code, n, screened, tool_free, speculated, *more in rows:
        audited, agreed, first, last, reviewed, last_reviewed = more
        _add_group(counts, status, answerer, reason, code, n, screened, tool_free or 0, speculated)
        counts.audited += audited or 0
        counts.audit_agreed += agreed or 0
        counts.first_started = _earliest(counts.first_started, first)
        counts.last_finished = _latest(counts.last_finished, last)
        counts.reviewed += reviewed
        counts.last_reviewed = _latest(counts.last_reviewed, last_reviewed)
    return counts


def tallied(session: Session, batch_id: str) -> BatchCounts:
    """A batch's counts from its tallies (``common.store.tallies``): what ``counts_of``
    adds up, group by group, and its rows and verdicts; the earliest start and latest
    finish and review are high-water marks (a job tried again does not lower them)."""
    counts = BatchCounts()
    for row in session.execute(select(tallies.kept([batch_id]))):
        counts.first_started = _earliest(counts.first_started, row.first_started)
        counts.last_finished = _latest(counts.last_finished, row.last_finished)
        counts.last_reviewed = _latest(counts.last_reviewed, row.last_reviewed)
        counts.items += row.items
        counts.verdicts += row.verdicts
        counts.pending += row.pending
        if row.n <= 0:
            continue  # (the rows' group, or a group its jobs have all left)
        group = (row.status, row.answered_by or None, row.defer_reason or None, row.error_code)
        _add_group(counts, *group, row.n, row.screened, row.tool_free, row.speculated)
        counts.audited += row.audited
        counts.audit_agreed += row.agreed
        counts.reviewed += row.reviewed
    return counts


def _add_group(
    counts: BatchCounts,
    status: str,
    answerer: str | None,
    reason: str | None,
    code: str | None,
    n: int,
    screened: int,
    tool_free: int,
    speculated: int,
) -> None:
    """Add one group of jobs (a status, who answered, why deferred, an error code)."""
    counts.jobs += n
    counts.by_status[status] += n
    if answerer:
        counts.by_answerer[answerer] += n
    if reason:
        counts.by_defer_reason[reason] += n
    if status == JobStatus.FAILED:
        counts.failures[code or "unknown"] += n
    elif status == JobStatus.CANCELLED:
        counts.cancellations[code or "cancelled"] += n
    counts.screened += screened
    counts.screened_tool_free += tool_free
    counts.speculated += speculated
    counts.accepted += speculated if answerer == AnsweredBy.SMALL else 0


def _tally(condition: Any) -> Any:
    """How many rows of a group meet ``condition``."""
    return func.sum(case((condition, 1), else_=0))


def _earliest(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None else a if b is None else min(a, b)


def _latest(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None else a if b is None else max(a, b)


def failure_codes(session: Session, batch_id: str) -> list[str]:
    """The error codes of the batch's failed jobs (found through the failed jobs, not the
    batch's every row)."""
    in_batch = (
        select(BatchItem.job_id)
        .where(BatchItem.job_id == Job.id, BatchItem.batch_id == batch_id)
        .exists()
    )
    query = select(Job.error_code).where(Job.status == JobStatus.FAILED, in_batch).distinct()
    return sorted(code or "unknown" for code in session.scalars(query))


def get_job(session: Session, job_id: str) -> Job | None:
    return session.get(Job, job_id)


def get_batch(session: Session, batch_id: str) -> Batch | None:
    return session.get(Batch, batch_id)


def unfinished_jobs(session: Session, tenant: str | None) -> int:
    """A tenant's jobs that wait or run (queued, deferred, running)."""
    waiting = (JobStatus.QUEUED, JobStatus.DEFERRED, JobStatus.RUNNING)
    query = select(func.count()).select_from(Job).where(Job.status.in_(waiting))
    return session.scalar(query.where(Job.tenant == tenant)) or 0


def find_batch(session: Session, id_or_name: str) -> Batch | None:
    """A batch by id; by the path ``annotate`` was given, where that path exists here (the
    newest batch of that source, never another corpus's of the same file name); else the
    newest batch of that name, else the newest whose name is that with a suffix
    (``manifest`` finds ``manifest.jsonl``) or without one."""
    batch = session.get(Batch, id_or_name)
    if batch is not None:
        return batch
    newest = select(Batch).order_by(Batch.created_at.desc()).limit(1)
    path = Path(id_or_name).expanduser()
    if "/" in id_or_name and path.exists():
        return session.scalars(newest.where(Batch.source == str(path.resolve()))).first()
    for name in dict.fromkeys((id_or_name, path.stem)):
        batch = session.scalars(newest.where(Batch.name == name)).first()
        if batch is not None:
            return batch
    escaped = id_or_name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    suffixed = Batch.name.like(escaped + ".%", escape="\\")
    return session.scalars(newest.where(suffixed)).first()


def require_batch(session: Session, id_or_name: str) -> Batch:
    """``find_batch``, or ``NotFound`` naming the closest names the store holds."""
    batch = find_batch(session, id_or_name)
    if batch is not None:
        return batch
    names = list(session.scalars(select(Batch.name).distinct()))
    close = difflib.get_close_matches(id_or_name, names, n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(repr(name) for name in close)}?" if close else ""
    raise NotFound(
        f"no batch {id_or_name!r} in this job store{hint} (speceyes batches lists them)",
        code="batch_not_found",
    )


def batch_results(
    session: Session,
    batch_id: str,
    *,
    status: str | None = None,
    item_ids: Sequence[str] | None = None,
) -> Iterator[tuple[BatchItem, Job]]:
    """A batch's rows in order, each with its job (only jobs in ``status``, only rows
    with ``item_ids``, if given)."""
    query = (
        select(BatchItem, Job)
        .join(Job, Job.id == BatchItem.job_id)
        .where(BatchItem.batch_id == batch_id)
        .order_by(BatchItem.position)
    )
    if status is not None:
        query = query.where(Job.status == status)
    if item_ids is not None:
        query = query.where(BatchItem.item_id.in_(item_ids))
    for item, job in session.execute(query.execution_options(yield_per=500)):  # noqa: UP028
        yield item, job


def waiting_jobs(session: Session) -> dict[Stage, list[str]]:
    """Every job waiting for a stage: queued (fast) or deferred (agent)."""
    rows = session.execute(
        select(Job.id, Job.status).where(Job.status.in_(list(WAITING_FOR.values())))
    ).all()
    by_status: dict[str, Stage] = {waiting: stage for stage, waiting in WAITING_FOR.items()}
    found: dict[Stage, list[str]] = {stage: [] for stage in WAITING_FOR}
    for job_id, status in rows:
        found[by_status[status]].append(job_id)
    return found


def priorities(session: Session, job_ids: Sequence[str]) -> dict[str, int]:
    """The priority rank of each of ``job_ids`` that is not normal (most jobs are: what
    the broker sends at its normal step needs no entry)."""
    if not job_ids:
        return {}
    normal = Priority.NORMAL.rank
    found: dict[str, int] = {}
    ids = list(dict.fromkeys(job_ids))
    for start in range(0, len(ids), 1000):
        query = select(Job.id, Job.priority).where(
            Job.id.in_(ids[start : start + 1000]), Job.priority != normal
        )
        found.update(dict(session.execute(query).all()))
    return found
