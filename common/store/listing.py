"""A caller's own batches and jobs, newest first, a page at a time: what ``GET
/v1/batches``, ``GET /v1/jobs`` and ``speceyes batches`` read.

Pages are cut by id, never by offset: ids begin with the microsecond they were made
(``common.store.ids.new_id``), so "newest first" is the primary key's order, read
through its index, and a page is "the next ``limit`` after this id", as cheap deep in a
store of millions as on its first page, and stable while new work arrives (it lands
before the first page, not in the middle of the one being read). The cursor handed
back is the last id of the page.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from common.contracts import FINISHED
from common.errors import InvalidInput
from common.store import tallies
from common.store.tables import Batch, BatchItem, Job, WebhookDelivery

MOST_PER_PAGE = 500
_ID = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class BatchLine:
    """One batch in a listing."""

    batch: Batch
    jobs: int
    by_status: Counter[str]

    @property
    def unfinished(self) -> int:
        return self.jobs - sum(self.by_status[status] for status in FINISHED)


@dataclass(frozen=True)
class Window:
    """Which rows a page is cut from: ``tenant``'s own (``everyone``: every tenant's, for
    an admin or where keys are off), made within ``created_from`` .. ``created_to`` (either
    may be open), after the id ``after`` (the previous page's cursor), ``limit`` of them."""

    tenant: str | None
    everyone: bool = False
    after: str | None = None
    limit: int = 50
    created_from: datetime | None = None
    created_to: datetime | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MOST_PER_PAGE:
            raise InvalidInput(f"limit must be 1 to {MOST_PER_PAGE}; got {self.limit}")
        if self.after is not None and not _ID.fullmatch(self.after):
            raise InvalidInput(
                "after must be the next_cursor of a previous page (32 hex digits)",
                code="invalid_cursor",
            )

    def cut(
        self, query: Select[Any], table: type[Batch] | type[Job] | type[WebhookDelivery]
    ) -> Select[Any]:
        """``query`` of ``table`` cut to this window, newest first, one more row than the
        page (whether there is a next one)."""
        if not self.everyone:
            query = query.where(table.tenant == self.tenant)
        if self.created_from is not None:
            query = query.where(table.created_at >= self.created_from)
        if self.created_to is not None:
            query = query.where(table.created_at < self.created_to)
        if self.after is not None:
            query = query.where(table.id < self.after)
        return query.order_by(table.id.desc()).limit(self.limit + 1)

    def page(self, rows: list[Any], id_of: Any) -> tuple[list[Any], str | None]:
        """The page's rows, and the cursor of the next page (None: this was the last)."""
        if len(rows) <= self.limit:
            return rows, None
        rows = rows[: self.limit]
        return rows, str(id_of(rows[-1]))


def batches_page(
    session: Session, window: Window, *, name: str | None = None
) -> tuple[list[BatchLine], str | None]:
    """A page of batches (named ``name``, if given), each with its jobs by status."""
    query = window.cut(select(Batch), Batch)
    if name is not None:
        query = query.where(Batch.name == name)
    batches, cursor = window.page(list(session.scalars(query)), lambda batch: batch.id)
    return counted(session, batches), cursor


def jobs_page(
    session: Session, window: Window, *, status: str | None = None, batch_id: str | None = None
) -> tuple[list[Job], str | None]:
    """A page of jobs (in ``status``, of the batch ``batch_id``, where given)."""
    query = window.cut(select(Job), Job)
    if status is not None:
        query = query.where(Job.status == status)
    if batch_id is not None:
        rows = select(BatchItem.job_id).where(BatchItem.batch_id == batch_id)
        query = query.where(Job.id.in_(rows))
    return window.page(list(session.scalars(query)), lambda job: job.id)


def counted(session: Session, batches: list[Batch]) -> list[BatchLine]:
    """``batches`` with their jobs counted by status (a job two rows share, once), from
    the tallies kept as they change (``common.store.tallies``)."""
    counts: dict[str, Counter[str]] = {batch.id: Counter() for batch in batches}
    groups = tallies.kept(list(counts))
    rows = session.execute(
        select(groups.c.batch_id, groups.c.status, groups.c.n).where(groups.c.n > 0)
    )
    for batch_id, status, n in rows:
        counts[batch_id][status] += n
    return [BatchLine(batch, sum(counts[batch.id].values()), counts[batch.id]) for batch in batches]
