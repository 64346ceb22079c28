"""A person's review of an answer, and the queue of answers most worth a look.

A review confirms or corrects a finished job's answer. It is kept beside the model's
answer, never over it: ``reviewed_answer``, ``reviewer`` (the API key's name) and
``reviewed_at`` on the job; ``Job.given_answer`` is what the job hands on. Reviewing
again replaces the earlier review (the model's answer stays as it was).

The review queue of a batch is ordered by what a look is worth:

1. accepted answers the online audit disagreed with (the agent answered otherwise);
2. the small model's accepted answers, closest to the gate's tau first;
3. failed jobs (a person can give the answer nobody gave).

Reviewed jobs leave the queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select
from sqlalchemy.orm import Session

from common.contracts import FINISHED, AnsweredBy, JobStatus
from common.errors import InvalidInput
from common.limits import check_text
from common.store import reads, tallies
from common.store.browse import ResultRow, Rows, as_rows
from common.store.expressions import GateMargin
from common.store.tables import Job, utcnow

MAX_ANSWER_CHARS = 2000  # a reviewed answer is an answer, not an essay
REVIEWABLE = FINISHED  # (a cancelled job too: a person may answer it)


class NotReviewable(InvalidInput):
    """The job is not finished: there is no answer to review yet."""


def review_job(
    session: Session, job: Job, answer: str, reviewer: str, *, now: datetime | None = None
) -> Job:
    """Record ``reviewer``'s answer for ``job``: stripped; for a multiple-choice job, an
    option given by its letter or text, kept as the option's text (one form in every
    export). Refused, with the reason, for an unfinished job or an empty, overlong,
    unstorable or unknown-option answer."""
    text = check_text(answer, "the reviewed answer").strip()
    if job.status not in REVIEWABLE:
        raise NotReviewable(
            f"job {job.id} is {job.status}: only a finished job (done or failed) can be reviewed",
            code="job_not_finished",
        )
    if not text:
        raise InvalidInput("the reviewed answer is empty", code="review_invalid")
    if len(text) > MAX_ANSWER_CHARS:
        raise InvalidInput(
            f"the reviewed answer has {len(text)} characters; at most {MAX_ANSWER_CHARS}",
            code="review_invalid",
        )
    if job.options:
        index = option_index(text, job.options)
        if index is None:
            raise InvalidInput(
                f"{text[:40]!r} is not one of the job's options: give a letter "
                f"A-{chr(ord('A') + len(job.options) - 1)} or an option's text",
                code="review_invalid",
            )
        text = job.options[index]
    job.reviewed_answer = text
    job.reviewer = reviewer
    job.reviewed_at = now or utcnow()
    return job


def option_index(answer: str, options: list[str]) -> int | None:
    """Which option ``answer`` names: its exact text first (options may be letters
    themselves), else its letter A-Z, case aside."""
    if answer in options:
        return options.index(answer)
    if len(answer) == 1 and answer.isascii() and answer.isalpha():
        index = ord(answer.upper()) - ord("A")
        return index if 0 <= index < len(options) else None
    return None


@dataclass(frozen=True)
class QueueEntry(ResultRow):
    """One job of the review queue (a row of the batch asking it), and why it is there."""

    why: str  # audit_disagrees | near_threshold | failed


def review_queue(session: Session, scope: str | Rows, *, limit: int = 50) -> list[QueueEntry]:
    """The unreviewed jobs of ``scope`` (a batch's id, or ``Rows``: the jobs a tenant sent
    alone) most worth a look, in the module's order."""
    listing = as_rows(scope)
    rows = listing.select(Job.reviewed_at.is_(None))
    plans = _plans(session, listing, limit)
    margin = GateMargin() + 0 if plans["near_threshold"] else GateMargin()
    tiers: list[tuple[str, Select[Any]]] = [
        (
            "audit_disagrees",
            rows.where(Job.audit_agrees.is_(False)).order_by(_order(listing, plans, "disagree")),
        ),
        (
            "near_threshold",
            rows.where(
                Job.answered_by == AnsweredBy.SMALL, Job.audit_agrees.is_not(False)
            ).order_by(margin, listing.order),
        ),
        (
            "failed",
            rows.where(Job.status == JobStatus.FAILED).order_by(_order(listing, plans, "failed")),
        ),
    ]
    found: list[QueueEntry] = []
    seen: set[str] = set()  # a job two rows of the batch share is listed once
    for why, query in tiers:
        if len(found) >= limit:
            break
        for result in session.execute(query.limit(limit - len(found) + len(seen))):
            row = listing.row(result)
            if row.job.id not in seen and len(found) < limit:
                seen.add(row.job.id)
                found.append(QueueEntry(row.item, row.job, why))
    return found


def _order(listing: Rows, plans: dict[str, bool], tier: str) -> Any:
    """The tier's order: its rows', written so that no index serves it where the plan is
    to read the few matching jobs first and sort them (an index on the order would walk
    the whole batch for them)."""
    return listing.order + 0 if plans[tier] else listing.order


def _plans(session: Session, listing: Rows, limit: int) -> dict[str, bool]:
    """Per tier, whether to read it in another way than the rows' own order would (the
    kept counts of the batch and of the store tell which reads less):

    - ``disagree``, ``failed``: the matching jobs of the whole store, sorted, rather than
      the batch's rows walked in order until ``limit`` match;
    - ``near_threshold``: the batch's accepted answers sorted by margin, rather than the
      store's walked in margin order until ``limit`` are the batch's.

    A list of jobs sent alone (no batch) reads as it always did."""
    if listing.batch_id is None:
        return {"disagree": False, "failed": False, "near_threshold": False}
    batch = reads.batch_counts(session, listing.batch_id)
    store = tallies.store_sums(session)

    def walked(matching: int) -> float:  # rows walked in order until ``limit`` match
        return batch.items * min(1.0, limit / max(matching, 1))

    disagree = batch.audited - batch.audit_agreed
    small = batch.by_answerer[AnsweredBy.SMALL]
    return {
        "disagree": store.disagreed < walked(disagree),
        "failed": store.failed < walked(batch.by_status[JobStatus.FAILED]),
        "near_threshold": limit * store.small / max(small, 1) > batch.items,
    }
