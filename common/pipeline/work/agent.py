"""Phase IV over one job, the agent's loop: what the slow pool runs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from common.contracts import (
    AgentOutcome,
    DeferReason,
    Failed,
    FailureCode,
    Stage,
    Ticket,
)
from common.errors import RetryableError, StopRequested
from common.logs import job_failed
from common.pipeline.audit import agrees as audit_agrees
from common.pipeline.audit import check_drift
from common.pipeline.funnel import run_agent_stage
from common.pipeline.work.unit import (
    StageReport,
    WorkUnit,
    load_query,
    log_retry,
)
from common.store import audits, cancels, claims
from common.store.tables import Job

log = logging.getLogger(__name__)


class StopBetweenSteps:
    """The large model, with one question before each of its generations: was the job
    cancelled meanwhile? Then the trajectory stops there (``StopRequested``), its step
    before finished and nothing half done. Everything else is the model's own."""

    def __init__(self, model: Any, asked: Callable[[], bool]) -> None:
        self._model, self._asked = model, asked

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        if self._asked():
            raise StopRequested("the job was cancelled")
        return self._model.generate(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class AgentWork(WorkUnit):
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
            log_retry(exc, "trajectory of job %s will be retried: %s", ticket.job_id, exc)
            self._release([ticket], report, count_attempt=False)
            return report
        except StopRequested as stop:
            done = None if stop.trajectory is None else stop.trajectory.to_dict()
            used = None if stop.trajectory is None else stop.trajectory.usage().to_dict()
            with self.statements.begin() as session:  # (kept: the steps it took, their cost)
                cancels.stop_running(
                    session, ticket.job_id, Stage.AGENT, trajectory=done, usage=used
                )
            log.info("job %s was cancelled: its trajectory stopped between steps", ticket.job_id)
            report.cancelled = 1
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
        large = StopBetweenSteps(self.models.large, lambda: self._stop_asked(ticket.job_id))
        return run_agent_stage(query, large, self.settings.agent, specreason=specreason)

    def _stop_asked(self, job_id: str) -> bool:
        with self.sessions() as session:
            return cancels.requested(session, job_id)

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
        """Run the agent on an accepted job (``common.pipeline.audit``): its answer and whether it
        agrees are recorded beside the accepted one, which stays the job's answer; a
        batch whose agreement drifted raises its alarm."""
        report = StageReport()
        started = time.perf_counter()
        try:
            outcome = self._trajectory(ticket)
        except RetryableError as exc:
            log_retry(exc, "audit of job %s will be retried: %s", ticket.job_id, exc)
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
        used = None if isinstance(outcome, Failed) else outcome.trajectory.usage().to_dict()
        with self.sessions.begin() as session:
            if isinstance(outcome, Failed) or outcome.answer is None:
                why = outcome.message if isinstance(outcome, Failed) else outcome.error
                audits.record(session, ticket.job_id, None, None, why or "no answer", used)
            else:
                job = session.get(Job, ticket.job_id)
                agreed = audit_agrees(job, outcome.answer) if job is not None else None
                audits.record(session, ticket.job_id, outcome.answer, agreed, None, used)
                report.alarms = check_drift(session, ticket.job_id, self.settings)
        report.seconds["audit"] = time.perf_counter() - started
        return report
