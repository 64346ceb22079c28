"""Phases I-III over claimed jobs, in micro-batches: what the fast pool runs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.orm import Session

from common.config import GateSettings
from common.contracts import (
    Accepted,
    DeferReason,
    Deferred,
    Failed,
    FastOutcome,
    JobStatus,
    Query,
    Queue,
    Stage,
    Ticket,
)
from common.errors import RetryableError
from common.logs import job_failed
from common.pipeline.audit import sampled
from common.pipeline.funnel import run_fast_stage
from common.pipeline.metering import Meter
from common.pipeline.work.unit import (
    StageReport,
    WorkUnit,
    halves,
    load_query,
    log_retry,
    pixel_groups,
    record_spent,
)
from common.store import audits, claims

log = logging.getLogger(__name__)


class FastWork(WorkUnit):
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
            self.dispatcher.send_again(self.sessions, Queue.SLOW, deferred)
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
        meter = Meter()  # what each job used, read by both recordings

        def send_screened(deferred: list[Deferred]) -> None:
            started = time.perf_counter()
            with self.dispatcher.transaction(self.sessions) as tx:
                claims.record_fast(tx.session, deferred, self.settings.funnel.gate, meter.jobs)
                tx.to_slow([outcome.job_id for outcome in deferred])
            record_spent(spent, started, tx.sent_s)
            sent.update(outcome.job_id for outcome in deferred)

        try:
            outcomes, seconds, gate = self._compute(group, send_screened, meter)
            started = time.perf_counter()
            with self.dispatcher.transaction(self.sessions) as tx:
                rest = [o for o in outcomes if o.job_id not in sent]
                claims.record_fast(tx.session, rest, gate, meter.jobs)
                tx.to_slow([o.job_id for o in rest if isinstance(o, Deferred)])
                tx.to_audit(self._sample_audits(tx.session, rest))
            record_spent(spent, started, tx.sent_s)
            deferred = [o.job_id for o in outcomes if isinstance(o, Deferred)]
        except RetryableError as exc:
            log_retry(exc, "fast batch of %d will be retried: %s", len(group), exc)
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
        self,
        group: list[Ticket],
        on_screened: Callable[[list[Deferred]], None] | None = None,
        meter: Meter | None = None,
    ) -> tuple[list[FastOutcome], dict[str, float], GateSettings]:
        """The group's outcomes, the seconds per phase, and the gate they were judged by
        (an audit alarm may have raised tau, or paused accepting: ``common.pipeline.audit``)."""
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
            limits=self.settings.agent,
            meter=meter,
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
