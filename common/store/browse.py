"""What the review pages (and their /v1 twins) read: a batch's results, filtered and
paged (the overview of a batch: ``common.store.overview``). The results of the jobs a
tenant sent alone (``POST /v1/jobs``) are listed the same way (``Rows.alone``): oldest
first, each its own row, with no expected answer.

Results are paged by cursor, never by offset: a page is "the next ``limit`` rows after
this one" in the listing's order (the batch's row order, or confidence then row), so
page 2,000 of a 100,000-row batch costs what page 1 does. Filters the database can judge
are SQL; "wrong against the expected answer" needs the scoring rules
(``common.protocols.scoring``), so those rows are fetched in chunks and judged here until the page
is full.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, false, not_, or_, select
from sqlalchemy.orm import Session, defer

from common.contracts import JobStatus
from common.protocols.scoring import is_correct
from common.store.tables import BatchItem, Job

PAGE_ROWS = 50
_JOB_ID = re.compile(r"[0-9a-f]{32}")
CHUNK_ROWS = 500  # rows fetched at once while a filter only Python can judge fills a page
SORTS = ("position", "confidence", "-confidence")
WHO = ("small", "large", "none")


@dataclass(frozen=True)
class ResultFilter:
    """Which of a batch's rows to list, and in what order. Every field is optional."""

    who: str | None = None  # small | large | none (nobody answered)
    status: str | None = None
    reason: str | None = None  # a failed job's error code
    wrong: bool = False  # answered otherwise than the expected answer (or not at all)
    disagree: bool = False  # the online audit disagreed
    conf_min: float | None = None  # the gate's confidence in the small model's answer
    conf_max: float | None = None
    reviewed: bool | None = None
    text: str | None = None  # in the question, the answers or the row's id
    sort: str = "position"  # position | confidence | -confidence

    def conditions(self, rows: Rows | None = None) -> list[ColumnElement[bool]]:
        """The filters as SQL (all but the scoring half of ``wrong``) over ``rows``
        (default: a batch's)."""
        alone = rows is not None and rows.batch_id is None
        item_id = Job.id if alone else BatchItem.item_id
        found: list[ColumnElement[bool]] = []
        if self.who == "none":
            found.append(Job.answered_by.is_(None))
        elif self.who:
            found.append(Job.answered_by == self.who)
        if self.status:
            found.append(Job.status == self.status)
        if self.reason:
            found.append(Job.error_code == self.reason)
        if self.disagree:
            found.append(Job.audit_agrees.is_(False))
        if self.conf_min is not None:
            found.append(Job.confidence >= self.conf_min)
        if self.conf_max is not None:
            found.append(Job.confidence <= self.conf_max)
        if self.reviewed is not None:
            found.append(
                Job.reviewed_at.is_not(None) if self.reviewed else Job.reviewed_at.is_(None)
            )
        if self.text:
            pattern = (
                "%" + self.text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            )
            found.append(
                or_(
                    *(
                        column.ilike(pattern, escape="\\")
                        for column in (Job.question, Job.final_answer, Job.reviewed_answer, item_id)
                    )
                )
            )
        if self.wrong and alone:  # (a job sent alone has no known answer)
            found.append(false())
        elif self.wrong:  # a finished row with a known answer that is not, word for word, it
            found.append(BatchItem.expected.is_not(None))
            found.append(Job.status.in_((JobStatus.DONE, JobStatus.FAILED)))
            found.append(or_(Job.final_answer.is_(None), Job.final_answer != BatchItem.expected))
        return found


@dataclass(frozen=True)
class ResultRow:
    item: BatchItem
    job: Job

    @property
    def correct(self) -> bool | None:
        """The model's answer against the row's expected answer (None: none known)."""
        if self.item.expected is None:
            return None
        return is_correct(self.job.final_answer, self.item.expected, self.job.options)


@dataclass(frozen=True)
class Rows:
    """Whose rows a listing reads: a batch's, in row order (``of_batch``), or the jobs a
    tenant sent alone, oldest first (``alone``; ``everyone``: every tenant's, for an
    admin or where keys are off)."""

    batch_id: str | None = None
    tenant: str | None = None
    everyone: bool = False

    @classmethod
    def of_batch(cls, batch_id: str) -> Rows:
        return cls(batch_id=batch_id)

    @classmethod
    def alone(cls, tenant: str | None, *, everyone: bool = False) -> Rows:
        return cls(None, tenant, everyone)

    @property
    def order(self) -> Any:
        """The column rows are listed by: the row's position, or the job's id (its age)."""
        return Job.id if self.batch_id is None else BatchItem.position

    def select(self, *conditions: ColumnElement[bool]) -> Select[Any]:
        """The rows that meet ``conditions``: (item, job), or (job,) for jobs sent alone
        (``row`` makes each a ``ResultRow``)."""
        query: Any
        if self.batch_id is not None:
            query = select(BatchItem, Job).join(Job, Job.id == BatchItem.job_id)
            return query.where(BatchItem.batch_id == self.batch_id, *conditions)
        query = select(Job).where(Job.announces.is_(True), *conditions)
        if not self.everyone:
            query = query.where(
                Job.tenant.is_(None) if self.tenant is None else Job.tenant == self.tenant
            )
        return query

    def failure_codes(self, session: Session) -> list[str]:
        """The error codes of the failed jobs among these rows."""
        failed = self.select(Job.status == JobStatus.FAILED)
        query = failed.with_only_columns(Job.error_code).distinct()
        return sorted(code or "unknown" for code in session.scalars(query))

    def row(self, found: Any) -> ResultRow:
        """A result of ``select`` as a row (a job sent alone: a row of its own)."""
        if self.batch_id is not None:
            return ResultRow(*found)
        (job,) = found
        return ResultRow(BatchItem(batch_id="", position=0, item_id=job.id, job_id=job.id), job)

    def key(self, row: ResultRow) -> str:
        """Where ``row`` stands in ``order``, as a cursor writes it."""
        return row.job.id if self.batch_id is None else str(row.item.position)

    def parse_key(self, text: str) -> int | str:
        if self.batch_id is None:
            if not _JOB_ID.fullmatch(text):
                raise ValueError(text)
            return text
        return _position(text)


def as_rows(scope: str | Rows) -> Rows:
    """A batch's id as its rows; ``Rows`` as they are."""
    return Rows.of_batch(scope) if isinstance(scope, str) else scope


@dataclass(frozen=True)
class ResultPage:
    rows: list[ResultRow]
    next_cursor: str | None  # None: this was the last page


def results_page(
    session: Session,
    scope: str | Rows,
    wanted: ResultFilter,
    *,
    after: str | None = None,
    limit: int = PAGE_ROWS,
) -> ResultPage:
    """Up to ``limit`` rows of ``scope`` (a batch's id, or ``Rows``) after the cursor
    ``after`` (from a previous page), and the cursor of the next page."""
    listing = as_rows(scope)
    query = listing.select(*wanted.conditions(listing)).options(
        defer(Job.trajectory),
        defer(Job.replay),
        defer(Job.token_scores),
        defer(Job.zoom_steps),
        defer(Job.zoom_replay),
    )
    query = _ordered(query, wanted.sort, listing)
    chunk_rows = CHUNK_ROWS if wanted.wrong else limit + 1
    rows: list[ResultRow] = []
    cursor = after
    while True:
        chunk = [
            listing.row(found)
            for found in session.execute(
                _after(query, wanted.sort, cursor, listing).limit(chunk_rows)
            )
        ]
        for row in chunk:
            if wanted.wrong and row.correct:
                continue
            if len(rows) == limit:  # a row beyond the page: there is a next one
                return ResultPage(rows, _cursor_of(rows[-1], wanted.sort, listing))
            rows.append(row)
        if len(chunk) < chunk_rows:
            return ResultPage(rows, None)
        cursor = _cursor_of(chunk[-1], wanted.sort, listing)


def _ordered(query: Select[Any], sort: str, listing: Rows) -> Select[Any]:
    if sort == "position":
        return query.order_by(listing.order)
    confidence = Job.confidence.desc() if sort == "-confidence" else Job.confidence.asc()
    # rows without a confidence (never speculated) come last, in row order
    return query.order_by(Job.confidence.is_(None), confidence, listing.order)


def _cursor_of(row: ResultRow, sort: str, listing: Rows) -> str:
    """Where a row stands in the listing's order: ``p<key>``, or, sorted by confidence,
    ``c<confidence>:<key>`` (``n:<key>`` without one); the key is the row's position (a
    job sent alone: its id)."""
    key = listing.key(row)
    if sort == "position":
        return f"p{key}"
    if row.job.confidence is None:
        return f"n:{key}"
    return f"c{row.job.confidence!r}:{key}"


def _after(query: Select[Any], sort: str, cursor: str | None, listing: Rows) -> Select[Any]:
    """The rows after ``cursor`` in the order of ``sort``."""
    if cursor is None:
        return query
    kind, position, confidence = _parse_cursor(cursor, sort, listing)
    after_position = listing.order > position
    if kind == "p":
        return query.where(after_position)
    no_confidence = Job.confidence.is_(None)
    if kind == "n":
        return query.where(no_confidence, after_position)
    beyond = Job.confidence < confidence if sort == "-confidence" else Job.confidence > confidence
    same = and_(Job.confidence == confidence, after_position)
    return query.where(or_(no_confidence, and_(not_(no_confidence), or_(beyond, same))))


class BadCursor(ValueError):
    pass


def _position(text: str) -> int:
    """A row position as a cursor holds it: what the column can hold (32-bit), or none."""
    position = int(text)
    if not 0 <= position < 2**31:
        raise ValueError(text)
    return position


def _parse_cursor(cursor: str, sort: str, listing: Rows) -> tuple[str, int | str, float]:
    try:
        if sort == "position" and cursor.startswith("p"):
            return "p", listing.parse_key(cursor[1:]), 0.0
        if sort != "position" and cursor.startswith("n:"):
            return "n", listing.parse_key(cursor[2:]), 0.0
        if sort != "position" and cursor.startswith("c"):
            confidence, position = cursor[1:].rsplit(":", 1)
            value = float(confidence)
            if math.isfinite(value):
                return "c", listing.parse_key(position), value
    except ValueError:
        pass
    raise BadCursor(f"cursor {cursor[:40]!r} is not one of this listing's (sorted by {sort})")
