"""Prometheus metrics of a worker process, served on its own port (``--metrics-port``).

Per stage: jobs by outcome, batch sizes, seconds per phase, and the depth of both queues
(read from Redis when scraped).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from common.contracts import Accepted, Deferred, Failed, JobStatus, Stage
from common.pipeline.work import StageReport
from workers.queues import CeleryDispatcher

JOBS = Counter(
    "speceyes_jobs_total",
    "Jobs handled, by stage and outcome (accepted, deferred, done, failed, retried, skipped).",
    ["stage", "outcome"],
)
SCREENED = Counter("speceyes_jobs_screened_total", "Jobs through phase I, by verdict.", ["verdict"])
BATCH_SIZE = Histogram(
    "speceyes_fast_batch_size",
    "Jobs per fast-stage batch (one celery-batches flush).",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
STAGE_SECONDS = Histogram(
    "speceyes_stage_seconds",
    "Seconds per phase: load, screen, speculate, gate, and the pipeline's own claim, "
    "record and send (per micro-batch); agent and its claim and record (per job).",
    ["phase"],
    buckets=(0.001, 0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)


def record_fast(batch_size: int, report: StageReport) -> None:
    BATCH_SIZE.observe(batch_size)
    for outcome in report.outcomes:
        kind = (
            "accepted"
            if isinstance(outcome, Accepted)
            else JobStatus.DEFERRED
            if isinstance(outcome, Deferred)
            else JobStatus.FAILED
        )
        JOBS.labels(Stage.FAST, kind).inc()
        screen = getattr(outcome, "screen", None)
        if screen is not None:
            SCREENED.labels("tools" if screen.needs_tools else "tool_free").inc()
    _record_common(Stage.FAST, report)


def record_agent(report: StageReport) -> None:
    if "agent" in report.seconds:  # the trajectory ran to its end
        JOBS.labels(Stage.AGENT, JobStatus.FAILED if report.failed else JobStatus.DONE).inc()
    elif report.failed:
        JOBS.labels(Stage.AGENT, JobStatus.FAILED).inc()
    elif report.cancelled:  # stopped between two steps
        JOBS.labels(Stage.AGENT, JobStatus.CANCELLED).inc()
    _record_common(Stage.AGENT, report, count_failed=False)


AUDITS = Counter("speceyes_audits_total", "Audits of accepted answers, by outcome.", ["outcome"])
AUDIT_ALARMS = Counter("speceyes_audit_alarms_total", "Audit drift alarms raised (per batch).")
AUDIT_DRIFT = Gauge("speceyes_audit_drift", "1 once this worker raised an audit drift alarm.")


def record_audit(report: StageReport) -> None:
    if "audit" in report.seconds:
        AUDITS.labels("done").inc()
        STAGE_SECONDS.labels("audit").observe(report.seconds["audit"])
    elif report.skipped:
        AUDITS.labels("skipped").inc()
    if report.alarms:
        AUDIT_ALARMS.inc(len(report.alarms))
        AUDIT_DRIFT.set(1)


def _record_common(stage: Stage, report: StageReport, count_failed: bool = True) -> None:
    for phase, seconds in report.seconds.items():
        STAGE_SECONDS.labels(phase).observe(seconds)
    own_failures = report.failed - sum(isinstance(o, Failed) for o in report.outcomes)
    if count_failed and own_failures > 0:
        JOBS.labels(stage, JobStatus.FAILED).inc(own_failures)
    if report.retry:
        JOBS.labels(stage, "retried").inc(len(report.retry))
    if report.skipped:
        JOBS.labels(stage, "skipped").inc(report.skipped)


class QueueDepth(Collector):
    """``speceyes_queue_depth{queue}``: messages waiting, read when scraped."""

    def __init__(self, broker: CeleryDispatcher) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily(
            "speceyes_queue_depth",
            "Messages waiting in the queue (a fast message holds up to a batch of jobs, a "
            "slow one up to 16).",
            labels=["queue"],
        )
        try:
            depths = self.broker.queue_depths()
        except Exception:  # a scrape must not fail because Redis blinked
            return
        for queue, depth in depths.items():
            family.add_metric([queue], depth)
        yield family


def wsgi_app(broker: CeleryDispatcher) -> Any:
    """The ``/metrics`` WSGI app, the queue depths included (``workers.supervision``
    serves it beside the health probes)."""
    REGISTRY.register(QueueDepth(broker))
    return make_wsgi_app()
