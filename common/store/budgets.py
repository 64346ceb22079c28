"""Failure budgets: a batch that fails past its budget stops early.

A batch may carry ``max_failure_rate`` (a share, 0 to 1) and ``budget_after`` (how many
of its jobs must have finished first, so that one early failure stops nothing). Each
time jobs finish, the batches they belong to that have a budget are checked: once at
least ``budget_after`` jobs have finished (done or failed), a failed share over the
rate cancels the rest with reason ``failure_budget`` (``common.store.cancels``: running
jobs finish their step) and the batch says why (``Batch.stopped``). A batch's rows are
counted only when it has a budget: most batches have none, and cost one lookup of the
finished jobs' batches.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from common.contracts import CancelReason, JobStatus
from common.store import cancels, webhooks
from common.store.reads import batch_counts
from common.store.tables import Batch, BatchItem

DEFAULT_AFTER = 10  # jobs finished before a budget applies, where the batch names none


def check(session: Session, finished_job_ids: Sequence[str]) -> list[str]:
    """Stop each budgeted batch of ``finished_job_ids`` (done or failed just now: a
    success may bring the count to ``budget_after`` with failures already over the rate)
    that is past its budget; the ids of the batches stopped now."""
    if not finished_job_ids:
        return []
    of_jobs = select(BatchItem.batch_id).where(BatchItem.job_id.in_(list(finished_job_ids)))
    budgeted = select(Batch).where(
        Batch.id.in_(of_jobs), Batch.max_failure_rate.is_not(None), Batch.stopped.is_(None)
    )
    stopped = []
    for batch in session.scalars(budgeted).all():
        counts = batch_counts(session, batch.id)
        failed = counts.by_status[JobStatus.FAILED]
        finished = counts.by_status[JobStatus.DONE] + failed
        after = DEFAULT_AFTER if batch.budget_after is None else batch.budget_after
        rate = batch.max_failure_rate or 0.0
        if finished == 0 or finished < after or failed / finished <= rate:
            continue
        cancels.cancel(session, cancels.batch_own_jobs(batch.id), CancelReason.FAILURE_BUDGET)
        batch.stopped = (
            f"failure_budget: {failed} of {finished} finished jobs failed "
            f"({failed / finished:.0%}, over its max_failure_rate of {rate:.0%}); the rest "
            "was cancelled (retry runs the failed and cancelled jobs again)"
        )
        webhooks.batch_cancelled(session, batch, CancelReason.FAILURE_BUDGET)
        stopped.append(batch.id)
    return stopped
