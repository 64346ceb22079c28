"""A batch's counts kept as its jobs and rows change, so that no page counts a batch by a
pass over it (issue 49).

``batch_tallies`` holds, per batch and group of the columns a batch's counts group by
(status, who answered, why deferred, error code), the sums ``reads.counts_of`` adds up,
and the earliest start and latest finish and review seen; the group of empty names
counts the batch's rows and judge verdicts. On SQLite triggers keep the tallies
(migrations 0022, 0023). On PostgreSQL triggers append each statement's changes to
``batch_tally_changes`` instead (many writers would queue on a batch's few tally rows):
a read adds them (``kept``), and ``fold`` moves them into the tallies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    ForeignKey,
    Index,
    Integer,
    String,
    func,
    literal,
    select,
    text,
    union_all,
)
from sqlalchemy.orm import Mapped, Session, mapped_column

from common.contracts import AnsweredBy, JobStatus
from common.store.db import is_postgres
from common.store.tables import Base, UtcDateTime

GROUP = ("status", "answered_by", "defer_reason", "error_code")
JOB_SUMS = ("n", "screened", "tool_free", "speculated", "audited", "agreed", "reviewed")
SUMS = (*JOB_SUMS, "items", "verdicts")  # (the rows': in the group of '' names)
MARKS: dict[str, Any] = {
    "first_started": func.min,
    "last_finished": func.max,
    "last_reviewed": func.max,
}
FOLD_AT = 1_000  # a batch's changes a read folds beyond (PostgreSQL)
FOLD_SLICE = 20_000  # changes one fold moves in a statement
FOLD_LOCK = 4_900_023  # the advisory lock one fold at a time holds (PostgreSQL)


class _Counts:
    """The columns tallies and their changes share."""

    batch_id: Mapped[str]
    status: Mapped[str] = mapped_column(String(64), primary_key=True)
    answered_by: Mapped[str] = mapped_column(String(64), primary_key=True)
    defer_reason: Mapped[str] = mapped_column(String(64), primary_key=True)
    error_code: Mapped[str] = mapped_column(String(64), primary_key=True)
    n: Mapped[int] = mapped_column(Integer, server_default="0")
    screened: Mapped[int] = mapped_column(Integer, server_default="0")
    tool_free: Mapped[int] = mapped_column(Integer, server_default="0")
    speculated: Mapped[int] = mapped_column(Integer, server_default="0")
    audited: Mapped[int] = mapped_column(Integer, server_default="0")
    agreed: Mapped[int] = mapped_column(Integer, server_default="0")
    reviewed: Mapped[int] = mapped_column(Integer, server_default="0")
    items: Mapped[int] = mapped_column(Integer, server_default="0")  # (group of '' names)
    verdicts: Mapped[int] = mapped_column(Integer, server_default="0")
    first_started: Mapped[datetime | None] = mapped_column(UtcDateTime())
    last_finished: Mapped[datetime | None] = mapped_column(UtcDateTime())
    last_reviewed: Mapped[datetime | None] = mapped_column(UtcDateTime())


class BatchTally(_Counts, Base):
    """A batch's counts for one group: '' stands for none in a group column; a group whose
    jobs have all left stays, at zero."""

    __tablename__ = "batch_tallies"

    batch_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True
    )


class TallyChange(_Counts, Base):
    """What one statement changed of a batch's counts for one group (PostgreSQL), until a
    fold adds it to the tallies. No key to the batch: a deleted batch's are dropped."""

    __tablename__ = "batch_tally_changes"
    __table_args__ = (Index("ix_batch_tally_changes_batch", "batch_id", "id"),)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"), primary_key=True
    )
    batch_id: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(64))
    answered_by: Mapped[str] = mapped_column(String(64))
    defer_reason: Mapped[str] = mapped_column(String(64))
    error_code: Mapped[str] = mapped_column(String(64))


def kept(batch_ids: list[str]) -> Any:
    """A subquery of the batches' counts, a row per batch and group: the tallies and the
    changes not yet folded, added up; ``pending`` counts those changes."""
    parts = [
        select(
            table.batch_id,
            *(getattr(table, name) for name in (*GROUP, *SUMS, *MARKS)),
            literal(pending).label("pending"),
        ).where(table.batch_id.in_(batch_ids))
        for table, pending in ((BatchTally, 0), (TallyChange, 1))
    ]
    both = union_all(*parts).subquery()
    keys = [both.c[name] for name in ("batch_id", *GROUP)]
    return (
        select(
            *keys,
            *(func.sum(both.c[name]).label(name) for name in (*SUMS, "pending")),
            *(pick(both.c[name]).label(name) for name, pick in MARKS.items()),
        )
        .group_by(*keys)
        .subquery()
    )


def jobs_in(batch_id: Any, statuses: Sequence[str]) -> Any:
    """An SQL expression: the batch's jobs (``batch_id``: a column, for a batch of the
    enclosing query) in ``statuses``, as kept."""
    parts = [
        select(func.coalesce(func.sum(table.n), 0))
        .where(table.batch_id == batch_id, table.status.in_(statuses))
        .scalar_subquery()
        for table in (BatchTally, TallyChange)
    ]
    return parts[0] + parts[1]


@dataclass(frozen=True)
class StoreSums:
    """What the kept counts say of the whole store (a job in two batches counted twice:
    an estimate, for choosing how to read)."""

    failed: int
    small: int  # answers of the small model
    disagreed: int  # answers the audit disagreed with


def store_sums(session: Session) -> StoreSums:
    """The store's failed jobs, small answers and audit disagreements, from every batch's
    kept counts (a few rows a batch)."""
    parts = [
        select(table.status, table.answered_by, table.n, table.audited, table.agreed)
        for table in (BatchTally, TallyChange)
    ]
    both = union_all(*parts).subquery()
    failed, small, disagreed = session.execute(
        select(
            func.coalesce(func.sum(both.c.n).filter(both.c.status == JobStatus.FAILED), 0),
            func.coalesce(func.sum(both.c.n).filter(both.c.answered_by == AnsweredBy.SMALL), 0),
            func.coalesce(func.sum(both.c.audited - both.c.agreed), 0),
        )
    ).one()
    return StoreSums(failed, small, disagreed)


def fold(where: Session | Connection, batch_id: str | None = None) -> int | None:
    """Move changes (the batch's, or any) into the tallies, a slice at a time, until fewer
    than a slice are left; the changes moved, or None where another fold holds the lock
    (PostgreSQL: one fold at a time; SQLite keeps no changes)."""
    if not is_postgres(where):
        return 0
    if not where.scalar(text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": FOLD_LOCK}):
        return None
    moved = 0
    while True:
        if batch_id is None:
            n = where.scalar(_FOLD_ANY, {"slice": FOLD_SLICE}) or 0
        else:
            n = where.scalar(_FOLD_BATCH, {"batch": batch_id, "slice": FOLD_SLICE}) or 0
        moved += n
        if n < FOLD_SLICE:
            return moved


def fold_now(where: Session, batch_id: str) -> None:
    """Fold the batch's changes in a transaction of their own, beside ``where``'s (a read,
    which must not write): a page that found many pays once, not on every read."""
    bind = where.get_bind()
    if isinstance(bind, Engine):
        with bind.begin() as connection:
            fold(connection, batch_id)


def _fold(which: str) -> Any:
    """Delete a slice of changes (those ``which`` names, oldest first) and add them up into
    the tallies, in one statement; it returns the changes moved. A deleted batch's are
    dropped."""
    columns = ("batch_id", *GROUP, *SUMS, *MARKS)
    key = ", ".join(("batch_id", *GROUP))
    grouped = ", ".join(f"g.{name}" for name in ("batch_id", *GROUP))
    added = ", ".join(f"{name} = batch_tallies.{name} + excluded.{name}" for name in SUMS)
    marks = ", ".join(
        f"{name} = {pick}(batch_tallies.{name}, excluded.{name})"
        for name, pick in (
            ("first_started", "least"),
            ("last_finished", "greatest"),
            ("last_reviewed", "greatest"),
        )
    )
    return text(
        "WITH gone AS (DELETE FROM batch_tally_changes WHERE id IN (SELECT id FROM "
        f"batch_tally_changes {which} ORDER BY id LIMIT :slice) RETURNING *), "
        f"put AS (INSERT INTO batch_tallies ({', '.join(columns)}) SELECT {grouped}, "
        f"{', '.join(f'sum(g.{name})' for name in SUMS)}, "
        "min(g.first_started), max(g.last_finished), max(g.last_reviewed) "
        f"FROM gone g JOIN batches b ON b.id = g.batch_id GROUP BY {grouped} "
        f"ORDER BY {grouped} ON CONFLICT ({key}) DO UPDATE SET {added}, {marks} RETURNING 1) "
        "SELECT count(*) FROM gone"
    )


_FOLD_ANY = _fold("")
_FOLD_BATCH = _fold("WHERE batch_id = :batch")
