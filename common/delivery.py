"""What a distributed worker does with the job ids a message carries.

Delivery is at-least-once (a worker that dies leaves its messages to come back after the
visibility timeout); the effects are exactly-once because every step is a conditional
write on the job row (``common.store.jobs``):

- a message for a job that is already finished, or waiting for the other stage, or
  running on a live worker, changes nothing;
- a job left ``running`` by a dead worker is claimed again once it is stale.

``FastStage.process`` runs phases I-III over the ids of one celery-batches flush; it
commits the batch's outcomes in one transaction and only then returns the jobs to put on
the slow queue. ``AgentStage.process`` runs one trajectory. Neither knows about Celery:
the tasks in ``workers/`` are thin wrappers that pass ids in and send what comes out.

Failures, which celery-batches leaves to us (it acknowledges a batch that raised):

- a group that raises is split in halves until the failing job stands alone;
- a lone failing job is retried (sent again after ``retry_delay_s``) until it has used
  ``max_attempts``, then it is ``failed`` with the last error;
- a job claimed before (its earlier worker died while holding it) runs in a group of its
  own, so a job that kills its worker takes nobody else down with it next time, and one
  over the limit is failed without running.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from common.agents.deepeyes import AgentLimits
from common.backends import Models
from common.backends.base import Query
from common.config import Settings
from common.errors import RetryableError
from common.funnel import (
    Deferred,
    Failed,
    FastOutcome,
    FunnelSettings,
    run_agent_stage,
    run_fast_stage,
)
from common.store import jobs as store
from common.store.jobs import Ticket
from common.store.tables import AGENT, DEFERRED, FAST, RUNNING

log = logging.getLogger(__name__)


@dataclass
class Delivery:
    """What a worker must do after its work is committed, and what happened (metrics)."""

    to_slow: list[str] = field(default_factory=list)  # deferred: send to the slow queue
    retry: list[str] = field(default_factory=list)  # released: send to this queue again
    outcomes: list[FastOutcome] = field(default_factory=list)
    failed: int = 0  # failed by this worker (limit reached, own error)
    skipped: int = 0  # nothing to do: finished, elsewhere, or a duplicate message
    seconds: dict[str, float] = field(default_factory=dict)  # per phase

    def merge(self, other: Delivery) -> None:
        self.to_slow += other.to_slow
        self.retry += other.retry
        self.outcomes += other.outcomes
        self.failed += other.failed
        self.skipped += other.skipped
        for phase, spent in other.seconds.items():
            self.seconds[phase] = self.seconds.get(phase, 0.0) + spent


def fail_exhausted(
    session: Session, tickets: list[Ticket], stage: str, limit: int, delivery: Delivery
) -> list[Ticket]:
    """Fail the claimed jobs that are over their attempt limit; returns the others."""
    for ticket in tickets:
        if ticket.attempts > limit:
            message = (
                f"gave up after {ticket.attempts - 1} attempts (limit {limit}): the worker "
                "running this job stopped before recording a result each time"
            )
            store.fail_running(session, ticket.job_id, stage, "attempts_exhausted", message)
            delivery.failed += 1
    return [ticket for ticket in tickets if ticket.attempts <= limit]


class FastStage:
    """Phases I-III for the job ids of one batch of messages."""

    def __init__(self, sessions: sessionmaker[Session], models: Models, settings: Settings):
        self.sessions = sessions
        self.models = models
        self.settings = settings
        self.funnel = FunnelSettings.from_settings(settings)

    def process(self, job_ids: Sequence[str], *, takeover: bool = False) -> Delivery:
        """Claim, run and record the jobs; ``takeover``: the ids were sent back by the
        worker that held them (see the tasks), so running ones are claimed at once."""
        delivery = Delivery()
        with self.sessions.begin() as session:
            tickets = store.claim_ids(session, job_ids, FAST, stale_after_s=None)
            tickets = fail_exhausted(session, tickets, FAST, self.settings.max_attempts, delivery)
            claimed = {ticket.job_id for ticket in tickets}
            unclaimed = [job_id for job_id in job_ids if job_id not in claimed]
            others = store.statuses(session, unclaimed) if unclaimed else {}
        # Deferred by an earlier delivery of this message that died before sending them
        # on: send them again (a duplicate slow message changes nothing).
        delivery.to_slow += [job_id for job_id, status in others.items() if status == DEFERRED]
        fresh = [ticket for ticket in tickets if ticket.attempts == 1]
        if fresh:
            self._run_group(fresh, delivery)
        for ticket in tickets:  # tried before and failed: alone, so it fails alone
            if ticket.attempts > 1:
                self._run_group([ticket], delivery)
        # Running: a live worker's (left alone) or a dead one's (claimed once stale). Each
        # is claimed only when it runs, alone: a job that kills its worker uses up its
        # own attempts, never those of the jobs that were delivered with it.
        for job_id in [job_id for job_id, status in others.items() if status == RUNNING]:
            with self.sessions.begin() as session:
                stale_s = self.settings.visibility_timeout_s / 2
                held = store.claim_ids(
                    session, [job_id], FAST, stale_after_s=stale_s, takeover=takeover
                )
                held = fail_exhausted(session, held, FAST, self.settings.max_attempts, delivery)
            if held:
                self._run_group(held, delivery)
            else:
                delivery.skipped += 1
        delivery.skipped += sum(status not in (DEFERRED, RUNNING) for status in others.values())
        return delivery

    def _run_group(self, group: list[Ticket], delivery: Delivery) -> None:
        """Compute and commit one group; on an error, halve it until the culprit is alone."""
        try:
            outcomes, seconds = self._compute(group)
            with self.sessions.begin() as session:
                store.record_fast(session, outcomes, self.funnel.gate)
        except RetryableError as exc:
            log.warning("fast batch of %d will be retried: %s", len(group), exc)
            self._release(group, delivery, count_attempt=False)
            return
        except Exception as exc:
            if len(group) > 1:
                middle = len(group) // 2
                self._run_group(group[:middle], delivery)
                self._run_group(group[middle:], delivery)
                return
            self._lone_failure(group[0], exc, delivery)
            return
        deferred = [o.job_id for o in outcomes if isinstance(o, Deferred)]
        delivery.merge(Delivery(to_slow=deferred, outcomes=outcomes, seconds=seconds))

    def _compute(self, group: list[Ticket]) -> tuple[list[FastOutcome], dict[str, float]]:
        started = time.perf_counter()
        loaded = [ticket.load(self.settings.image_limits) for ticket in group]
        queries = [query for query in loaded if isinstance(query, Query)]
        outcomes: list[FastOutcome] = [query for query in loaded if isinstance(query, Failed)]
        load_s = time.perf_counter() - started
        result = run_fast_stage(
            queries, large=self.models.large, small=self.models.small, settings=self.funnel
        )
        return outcomes + result.outcomes, {"load": load_s, **result.seconds}

    def _release(self, group: list[Ticket], delivery: Delivery, count_attempt: bool = True) -> None:
        ids = [ticket.job_id for ticket in group]
        with self.sessions.begin() as session:
            store.release_ids(session, ids, FAST, count_attempt=count_attempt)
        delivery.retry += ids

    def _lone_failure(self, ticket: Ticket, exc: Exception, delivery: Delivery) -> None:
        reason = f"{type(exc).__name__}: {exc}"
        if ticket.attempts < self.settings.max_attempts:
            log.warning("job %s failed (attempt %d), retrying: %s", ticket.job_id,
                        ticket.attempts, reason)  # fmt: skip
            self._release([ticket], delivery)
            return
        log.error("job %s failed for good after %d attempts: %s", ticket.job_id,
                  ticket.attempts, reason)  # fmt: skip
        with self.sessions.begin() as session:
            store.fail_running(session, ticket.job_id, FAST, "internal_error", reason[:2000])
        delivery.failed += 1


class AgentStage:
    """Phase IV for the job id of one message."""

    def __init__(self, sessions: sessionmaker[Session], models: Models, settings: Settings):
        self.sessions = sessions
        self.models = models
        self.settings = settings
        self.limits = AgentLimits.from_settings(settings)

    def process(self, job_id: str, *, takeover: bool = False) -> Delivery:
        delivery = Delivery()
        limit = self.settings.max_attempts
        with self.sessions.begin() as session:
            stale_s = self.settings.visibility_timeout_s / 2
            tickets = store.claim_ids(
                session, [job_id], AGENT, stale_after_s=stale_s, takeover=takeover
            )
            if not tickets:
                delivery.skipped = 1
                return delivery
            tickets = fail_exhausted(session, tickets, AGENT, limit, delivery)
            if not tickets:
                return delivery
            ticket = tickets[0]
        started = time.perf_counter()
        try:
            query = ticket.load(self.settings.image_limits)
            outcome = (
                query
                if isinstance(query, Failed)
                else run_agent_stage(query, self.models.large, self.limits)
            )
            with self.sessions.begin() as session:
                store.record_agent(session, outcome)
        except RetryableError as exc:
            log.warning("trajectory of job %s will be retried: %s", job_id, exc)
            self._release(job_id, delivery, count_attempt=False)
            return delivery
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if ticket.attempts < limit:
                log.warning("job %s failed in the agent stage, retrying: %s", job_id, reason)
                self._release(job_id, delivery)
                return delivery
            with self.sessions.begin() as session:
                store.fail_running(session, job_id, AGENT, "internal_error", reason[:2000])
            delivery.failed = 1
            return delivery
        delivery.seconds["agent"] = time.perf_counter() - started
        if isinstance(outcome, Failed) or outcome.answer is None:
            delivery.failed = 1
        return delivery

    def _release(self, job_id: str, delivery: Delivery, count_attempt: bool = True) -> None:
        with self.sessions.begin() as session:
            store.release_ids(session, [job_id], AGENT, count_attempt=count_attempt)
        delivery.retry.append(job_id)
