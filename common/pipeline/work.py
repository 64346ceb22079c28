"""The unit of work every runner shares: tickets -> queries -> stage -> outcomes -> record.

``FastWork`` runs phases I-III over claimed jobs and ``AgentWork`` runs phase IV over one;
each records what happened with the conditional writes of ``common.store.claims`` and,
once that has committed, sends the jobs that go on (deferred ones to the agent, retries
back) through the ``Dispatcher``. The embedded runner claims waiting jobs from the store
and calls ``run``; a Celery task is handed job ids and calls ``run_ids``. Neither runner
holds any of this logic.

Delivery is at-least-once (a message comes back when its worker dies; a restarted run
finds jobs left running), the effects exactly-once: a job that is finished, waits for the
other stage or runs elsewhere right now is left alone, and a job left ``running`` by a
dead worker is claimed again once it is stale.

Failures:

- a group that raises is split in halves until the failing job stands alone;
- a lone failing job is sent back (after ``retry_delay_s``) until it has used
  ``max_attempts``, then it is ``failed`` with the last error (``internal_error``);
- a ``RetryableError`` (a model server down) sends the whole group back without using
  its attempts;
- a job claimed before (its earlier worker died while holding it) runs in a group of its
  own, so a job that kills its worker takes nobody else down with it next time, and one
  over the limit is failed without running (``attempts_exhausted``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from common.backends import Models
from common.config import GateSettings, ImageSettings, Settings
from common.contracts import (
    Accepted,
    AgentOutcome,
    DeferReason,
    Deferred,
    Failed,
    FailureCode,
    FastOutcome,
    JobStatus,
    Query,
    Stage,
    Ticket,
)
from common.errors import Interrupted, RetryableError
from common.evaluation.audit import agrees as audit_agrees
from common.evaluation.audit import check_drift, sampled
from common.logs import job_failed
from common.pipeline.dispatch import Dispatcher
from common.pipeline.funnel import prepare_query, run_agent_stage, run_fast_stage
from common.sources.locations import located_pixels
from common.store import audits, claims
from common.store.db import autocommit
from common.store.tables import Job

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
    seconds: dict[str, float] = field(default_factory=dict)  # per phase
    alarms: list[dict[str, Any]] = field(default_factory=list)  # audit drift raised now

    def merge(self, other: StageReport) -> None:
        self.to_slow += other.to_slow
        self.retry += other.retry
        self.outcomes += other.outcomes
        self.failed += other.failed
        self.skipped += other.skipped
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
    groups: list[list[Ticket]] = []
    held = budget  # start a new group at the first ticket
    for ticket in tickets:
        pixels = (
            located_pixels(ticket.image_path, limits or ImageSettings()) if ticket.image_path else 0
        )
        if held + pixels > budget or not groups:
            groups.append([])
            held = 0
        groups[-1].append(ticket)
        held += pixels
    return groups


def _spent(spent: dict[str, float], started: float, sent_s: float) -> None:
    """Add a record-and-send transaction begun at ``started`` to ``spent``: its sending
    (``sent_s``, after the commit) to "send", the rest to "record"."""
    spent["send"] += sent_s
    spent["record"] += time.perf_counter() - started - sent_s


def _log_retry(exc: RetryableError, message: str, *args: object) -> None:
    """A warning, unless the process is stopping (Ctrl-C): then putting work back is the
    plan, not news."""
    log.log(logging.INFO if isinstance(exc, Interrupted) else logging.WARNING, message, *args)


def halves(group: list[T]) -> list[list[T]]:
    """A first batch as it runs: its first half, then the rest (one group if it has one
    job), so the agents get a screen's rejects sooner."""
    head = max(1, len(group) // 2)
    return [part for part in (group[:head], group[head:]) if part]


class _Work:
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


class FastWork(_Work):
    """Phases I-III over a micro-batch of jobs.

    ``split_first``: this process's first batch runs half of its jobs first, so that
    the agents, idle until a screen is done, start sooner (the runner and the workers
    set it; a batch has a fixed cost, so the later ones stay whole).
    """

    stage = Stage.FAST

    def __init__(self, *args: Any, split_first: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._split_next = split_first
        self._claimed_controls: dict[str, Any] | None = None  # read with run_ids's claim

    def run(self, tickets: list[Ticket]) -> StageReport:
        """Run claimed jobs: the fresh ones as one group, each one tried before alone."""
        report = StageReport()
        with self.sessions.begin() as session:
            tickets = self._fail_exhausted(session, tickets, report)
        fresh = [ticket for ticket in tickets if ticket.attempts == 1]
        groups = pixel_groups(fresh, self.settings.funnel.fast_batch_pixels, self.settings.images)
        if groups and self._split_next:
            self._split_next = False
            groups[:1] = halves(groups[0])
        for group in groups:
            self._run_group(group, report)
        for ticket in tickets:  # tried before and failed: alone, so it fails alone
            if ticket.attempts > 1:
                self._run_group([ticket], report)
        return report

    def run_ids(self, job_ids: Sequence[str], *, takeover: bool = False) -> StageReport:
        """Claim the named jobs (a batch of messages) and run them.

        ``takeover``: the ids were sent back by the worker that held them, so running ones
        are claimed at once.
        """
        started = time.perf_counter()
        with self.claiming.begin() as session:  # (no write here needs another's)
            tickets = claims.claim_ids(
                session,
                job_ids,
                Stage.FAST,
                stale_after_s=None,
                worker=self.worker,
                untried_only=True,
            )
            # (read beside the claim, on its connection: as fresh as the claim)
            self._claimed_controls = audits.controls(session)
            claimed = {ticket.job_id for ticket in tickets}
            unclaimed = [job_id for job_id in job_ids if job_id not in claimed]
            others = claims.statuses(session, unclaimed) if unclaimed else {}
        claim_s = time.perf_counter() - started
        try:
            report = self.run(tickets)
        finally:
            self._claimed_controls = None
        report.seconds["claim"] = report.seconds.get("claim", 0.0) + claim_s
        # Deferred by an earlier delivery of this message that died before sending them
        # on: send them again (a duplicate slow message changes nothing).
        deferred = [job_id for job_id, status in others.items() if status == JobStatus.DEFERRED]
        if deferred:
            self.dispatcher.send_slow(deferred)
            report.to_slow += deferred
        # Running: a live worker's (left alone) or a dead one's (claimed once stale); or
        # waiting after a try (handed back when its worker died, or a retry). Each is
        # claimed only when it runs, alone: a job that kills its worker uses up its own
        # attempts, never those of the jobs that were delivered with it.
        for job_id, status in others.items():
            if status in (JobStatus.RUNNING, JobStatus.QUEUED):
                held = self._claim_named([job_id], takeover)
                if held:
                    report.merge(self.run(held))
                else:
                    report.skipped += 1
            elif status != JobStatus.DEFERRED:
                report.skipped += 1
        return report

    def _run_group(self, group: list[Ticket], report: StageReport) -> None:
        """Compute and commit one group; on an error, halve it until the culprit is alone."""
        sent: set[str] = set()  # deferred by screening and sent on already
        spent = {"record": 0.0, "send": 0.0}

        def send_screened(deferred: list[Deferred]) -> None:
            started = time.perf_counter()
            with self.dispatcher.transaction(self.sessions) as tx:
                claims.record_fast(tx.session, deferred, self.settings.funnel.gate)
                tx.to_slow([outcome.job_id for outcome in deferred])
            _spent(spent, started, tx.sent_s)
            sent.update(outcome.job_id for outcome in deferred)

        try:
            outcomes, seconds, gate = self._compute(group, send_screened)
            started = time.perf_counter()
            with self.dispatcher.transaction(self.sessions) as tx:
                rest = [o for o in outcomes if o.job_id not in sent]
                claims.record_fast(tx.session, rest, gate)
                tx.to_slow([o.job_id for o in rest if isinstance(o, Deferred)])
                tx.to_audit(self._sample_audits(tx.session, rest))
            _spent(spent, started, tx.sent_s)
            deferred = [o.job_id for o in outcomes if isinstance(o, Deferred)]
        except RetryableError as exc:
            _log_retry(exc, "fast batch of %d will be retried: %s", len(group), exc)
            self._release(group, report, count_attempt=False)
            return
        except Exception as exc:
            if len(group) > 1:
                middle = len(group) // 2
                self._run_group(group[:middle], report)
                self._run_group(group[middle:], report)
                return
            self._lone_failure(group[0], exc, report)
            return
        for outcome in outcomes:
            if isinstance(outcome, Failed):
                job_failed(outcome.job_id, self.stage, outcome.code, outcome.message)
        report.merge(StageReport(to_slow=deferred, outcomes=outcomes, seconds={**seconds, **spent}))

    def _compute(
        self, group: list[Ticket], on_screened: Callable[[list[Deferred]], None] | None = None
    ) -> tuple[list[FastOutcome], dict[str, float], GateSettings]:
        """The group's outcomes, the seconds per phase, and the gate they were judged by
        (an audit alarm may have raised tau, or paused accepting: ``common.evaluation.audit``)."""
        controls = self._claimed_controls
        if controls is None:
            with self.sessions() as session:
                controls = audits.controls(session)
        funnel = self.settings.funnel
        if "gate_threshold" in controls:
            raised = funnel.gate.model_copy(update={"threshold": controls["gate_threshold"]})
            funnel = funnel.model_copy(update={"gate": raised})
        started = time.perf_counter()
        loaded = [load_query(ticket, self.settings) for ticket in group]
        queries = [query for query in loaded if isinstance(query, Query)]
        outcomes: list[FastOutcome] = [query for query in loaded if isinstance(query, Failed)]
        load_s = time.perf_counter() - started
        if controls.get("paused"):
            paused = [Deferred(query.job_id, DeferReason.AUDIT_PAUSED) for query in queries]
            return outcomes + paused, {"load": load_s}, funnel.gate
        result = run_fast_stage(
            queries,
            large=self.models.large,
            small=self.models.small,
            settings=funnel,
            on_screened=on_screened,
        )
        return outcomes + result.outcomes, {"load": load_s, **result.seconds}, funnel.gate

    def _sample_audits(self, session: Session, outcomes: Sequence[FastOutcome]) -> list[str]:
        """Mark the accepted jobs the audit samples (by their keys: reruns pick the same)."""
        rate = self.settings.audit.rate
        accepted = [o.job_id for o in outcomes if isinstance(o, Accepted)]
        if not rate or not accepted:
            return []
        keys = audits.keys_of(session, accepted)
        return audits.request(session, [j for j in accepted if sampled(keys[j], rate)])


class AgentWork(_Work):
    """Phase IV for one job."""

    stage = Stage.AGENT

    def run(self, ticket: Ticket) -> StageReport:
        """Run one claimed job's trajectory and record its end."""
        report = StageReport()
        with self.sessions.begin() as session:
            if not self._fail_exhausted(session, [ticket], report):
                return report
        started = time.perf_counter()
        try:
            outcome = self._trajectory(ticket)
            recording = time.perf_counter()
            with self.statements.begin() as session:
                claims.record_agent(session, outcome)
            report.seconds["record"] = time.perf_counter() - recording
            report.seconds["agent"] = recording - started  # (the trajectory)
        except RetryableError as exc:
            _log_retry(exc, "trajectory of job %s will be retried: %s", ticket.job_id, exc)
            self._release([ticket], report, count_attempt=False)
            return report
        except Exception as exc:
            self._lone_failure(ticket, exc, report)
            return report
        if isinstance(outcome, Failed):
            job_failed(outcome.job_id, self.stage, outcome.code, outcome.message)
            report.failed = 1
        elif outcome.answer is None:
            job_failed(outcome.job_id, self.stage, outcome.error_code, outcome.error)
            report.failed = 1
        return report

    def _trajectory(self, ticket: Ticket) -> AgentOutcome | Failed:
        """The agent on the ticket's job (or the job failed: its image is unusable)."""
        query = load_query(ticket, self.settings)
        if isinstance(query, Failed):
            return query
        specreason = None
        if ticket.defer_reason == DeferReason.SPECREASON:  # submitted with --method specreason
            specreason = (self.models.small, self.settings.funnel.specreason_threshold)
        return run_agent_stage(query, self.models.large, self.settings.agent, specreason=specreason)

    def run_id(self, job_id: str, *, takeover: bool = False) -> StageReport:
        """Claim the job a message named (waiting, stale or handed back) and run it."""
        started = time.perf_counter()
        tickets = self._claim_named([job_id], takeover)
        claim_s = time.perf_counter() - started
        report = self.run(tickets[0]) if tickets else StageReport(skipped=1)
        report.seconds["claim"] = claim_s
        return report

    def run_audit_id(self, job_id: str) -> StageReport:
        """Claim the audit a message named (if still pending) and run it."""
        with self.sessions.begin() as session:
            tickets = audits.claim(session, [job_id], worker=self.worker)
        return self.run_audit(tickets[0]) if tickets else StageReport(skipped=1)

    def run_audit(self, ticket: Ticket) -> StageReport:
        """Run the agent on an accepted job (``common.evaluation.audit``): its answer and whether it
        agrees are recorded beside the accepted one, which stays the job's answer; a
        batch whose agreement drifted raises its alarm."""
        report = StageReport()
        started = time.perf_counter()
        try:
            outcome = self._trajectory(ticket)
        except RetryableError as exc:
            _log_retry(exc, "audit of job %s will be retried: %s", ticket.job_id, exc)
            with self.dispatcher.transaction(
                self.sessions, delay_s=self.settings.recovery.retry_delay_s
            ) as tx:
                audits.put_back(tx.session, ticket.job_id)
                tx.to_audit([ticket.job_id])
            return report
        except Exception as exc:  # an audit never fails its job: it is recorded as failed
            outcome = Failed(
                ticket.job_id, FailureCode.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"
            )
        with self.sessions.begin() as session:
            if isinstance(outcome, Failed) or outcome.answer is None:
                why = outcome.message if isinstance(outcome, Failed) else outcome.error
                audits.record(session, ticket.job_id, None, None, why or "no answer")
            else:
                job = session.get(Job, ticket.job_id)
                agreed = audit_agrees(job, outcome.answer) if job is not None else None
                audits.record(session, ticket.job_id, outcome.answer, agreed, None)
                report.alarms = check_drift(session, ticket.job_id, self.settings)
        report.seconds["audit"] = time.perf_counter() - started
        return report
