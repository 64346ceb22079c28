"""What both halves of the work unit share: a stage's report, a ticket's query, its
retries and failures, the groups it splits a failing batch into, and ``WorkUnit``."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from common.backends import Models
from common.config import ImageSettings, Settings
from common.contracts import (
    Failed,
    FailureCode,
    FastOutcome,
    Query,
    Stage,
    Ticket,
)
from common.errors import Interrupted, RetryableError
from common.images import budget_groups
from common.logs import job_failed
from common.pipeline.dispatch import Dispatcher
from common.pipeline.funnel import prepare_query
from common.sources.reading import located_pixels
from common.store import claims
from common.store.db import autocommit

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class StageReport:
    """What a unit of work did, for the caller's metrics and tests."""

    to_slow: list[str] = field(default_factory=list)  # deferred: sent to the agent
    retry: list[str] = field(default_factory=list)  # released: sent to this stage again
    outcomes: list[FastOutcome] = field(default_factory=list)
    failed: int = 0  # failed by the work itself (limit reached, own error)
    skipped: int = 0  # nothing to do: finished, elsewhere, or a duplicate message
    cancelled: int = 0  # stopped between two steps: cancelled while it ran
    seconds: dict[str, float] = field(default_factory=dict)  # per phase
    alarms: list[dict[str, Any]] = field(default_factory=list)  # audit drift raised now

    def merge(self, other: StageReport) -> None:
        self.to_slow += other.to_slow
        self.retry += other.retry
        self.outcomes += other.outcomes
        self.failed += other.failed
        self.skipped += other.skipped
        self.cancelled += other.cancelled
        self.alarms += other.alarms
        for phase, spent in other.seconds.items():
            self.seconds[phase] = self.seconds.get(phase, 0.0) + spent


def load_query(ticket: Ticket, settings: Settings) -> Query | Failed:
    """The job's image and question as a ``Query``, or the job failed with the reason
    (missing, unreadable, corrupt or changed since it was submitted)."""
    if ticket.image_path is None:
        return Failed(ticket.job_id, FailureCode.IMAGE_MISSING, "the job has no image")
    return prepare_query(
        ticket.job_id,
        ticket.image_path,
        ticket.question,
        ticket.options,
        settings.images,
        expected_hash=ticket.image_hash,
        shown_path=ticket.shown_path,
    )


def pixel_groups(
    tickets: list[Ticket], budget: int, limits: ImageSettings | None = None
) -> list[list[Ticket]]:
    """``tickets`` in order, in groups whose images hold at most ``budget`` pixels together
    (read from their headers; a group has one ticket at least), so a batch of large images
    never holds more decoded at once than the budget."""
    read = limits or ImageSettings()

    def pixels_of(ticket: Ticket) -> int:
        return located_pixels(ticket.image_path, read) if ticket.image_path else 0

    return budget_groups(tickets, pixels_of, budget)


def record_spent(spent: dict[str, float], started: float, sent_s: float) -> None:
    """Add a record-and-send transaction begun at ``started`` to ``spent``: its sending
    (``sent_s``, after the commit) to "send", the rest to "record"."""
    spent["send"] += sent_s
    spent["record"] += time.perf_counter() - started - sent_s


def log_retry(exc: RetryableError, message: str, *args: object) -> None:
    """A warning, unless the process is stopping (Ctrl-C): then putting work back is the
    plan, not news."""
    log.log(logging.INFO if isinstance(exc, Interrupted) else logging.WARNING, message, *args)


def halves(group: list[T]) -> list[list[T]]:
    """A first batch as it runs: its first half, then the rest (one group if it has one
    job), so the agents get a screen's rejects sooner."""
    head = max(1, len(group) // 2)
    return [part for part in (group[:head], group[head:]) if part]


class WorkUnit:
    """What both stages share: the store, the models, the settings and the dispatcher."""

    stage: Stage

    def __init__(
        self,
        sessions: sessionmaker[Session],
        models: Models,
        settings: Settings,
        dispatcher: Dispatcher,
        worker: str | None = None,
    ) -> None:
        self.sessions = sessions
        self.models = models
        self.settings = settings
        self.dispatcher = dispatcher
        self.worker = worker  # named on the jobs it claims (its heartbeat vouches for them)
        # the writes that are one statement each: a trajectory's record, and claims (whose
        # commit need not wait for the disk: a lost claim only puts the job back to wait)
        self.statements = autocommit(sessions)
        self.claiming = autocommit(sessions, durable=False)

    def _fail_exhausted(
        self, session: Session, tickets: list[Ticket], report: StageReport
    ) -> list[Ticket]:
        """Fail the claimed jobs that are over their attempt limit; returns the others."""
        limit = self.settings.recovery.max_attempts
        for ticket in tickets:
            if ticket.attempts > limit:
                message = (
                    f"gave up after {ticket.attempts - 1} attempts (limit {limit}): the "
                    "worker running this job stopped before recording a result each time"
                )
                claims.fail_running(
                    session, ticket.job_id, self.stage, FailureCode.ATTEMPTS_EXHAUSTED, message
                )
                job_failed(ticket.job_id, self.stage, FailureCode.ATTEMPTS_EXHAUSTED, message)
                report.failed += 1
        return [ticket for ticket in tickets if ticket.attempts <= limit]

    def _claim_named(self, job_ids: Sequence[str], takeover: bool) -> list[Ticket]:
        """Claim the named jobs that wait for this stage, or that run but whose worker
        died (stale) or handed them back (``takeover``)."""
        with self.claiming.begin() as session:
            return claims.claim_ids(
                session,
                job_ids,
                self.stage,
                stale_after_s=self.settings.broker.visibility_timeout_s / 2,
                takeover=takeover,
                worker=self.worker,
            )

    def _release(self, tickets: list[Ticket], report: StageReport, *, count_attempt: bool) -> None:
        """Put the jobs back to wait for this stage, and send them again after a delay."""
        ids = [ticket.job_id for ticket in tickets]
        delay_s = self.settings.recovery.retry_delay_s
        with self.dispatcher.transaction(self.sessions, delay_s=delay_s) as outbox:
            claims.release_ids(outbox.session, ids, self.stage, count_attempt=count_attempt)
            (outbox.to_fast if self.stage == Stage.FAST else outbox.to_slow)(ids)
        report.retry += ids

    def _lone_failure(self, ticket: Ticket, exc: Exception, report: StageReport) -> None:
        """A job failed on its own: retry it while it has attempts left, else fail it."""
        reason = f"{type(exc).__name__}: {exc}"
        if ticket.attempts < self.settings.recovery.max_attempts:
            log.warning(
                "job %s failed in the %s stage (attempt %d), retrying: %s",
                ticket.job_id,
                self.stage,
                ticket.attempts,
                reason,
            )
            self._release([ticket], report, count_attempt=True)
            return
        log.error(
            "job %s failed for good after %d attempts: %s", ticket.job_id, ticket.attempts, reason
        )
        with self.sessions.begin() as session:
            claims.fail_running(
                session, ticket.job_id, self.stage, FailureCode.INTERNAL_ERROR, reason[:2000]
            )
        job_failed(ticket.job_id, self.stage, FailureCode.INTERNAL_ERROR, reason[:2000])
        report.failed += 1
