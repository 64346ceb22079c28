"""The API's own Prometheus metrics (``GET /metrics`` serves them with the process's)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from common.store import audits
from common.store.tables import Batch

SUBMITTED = Counter(
    "speceyes_api_jobs_submitted_total", "Jobs created through the API, by route.", ["route"]
)
REFUSED = Counter("speceyes_api_refused_total", "Requests answered 4xx, by error code.", ["error"])
TENANT_SUBMITTED = Counter(
    "speceyes_api_tenant_jobs_submitted_total",
    "Jobs created through the API, by tenant.",
    ["tenant"],
)
QUOTA_REFUSED = Counter(
    "speceyes_api_quota_refused_total",
    "Submissions refused past a daily quota (api.quotas), by tenant and quota.",
    ["tenant", "quota"],
)
UNSENT = Counter(
    "speceyes_api_unsent_total",
    "Jobs committed while the broker refused them (the reconciler sends them later).",
)


class StoreAudit(Collector):
    """The online audit as the store has it (the same from every replica): audited answers
    by agreement, and batches whose drift alarm is raised. Read when scraped."""

    def __init__(self, sessions: Any) -> None:
        self.sessions = sessions

    def collect(self) -> Iterator[Any]:
        try:
            with self.sessions() as session:
                audited, agreed = audits.counts(session)
                alarms = session.scalar(
                    select(func.count()).select_from(Batch).where(Batch.audit_alarm.is_not(None))
                )
        except Exception:  # a scrape must not fail because the database blinked
            return
        answers = GaugeMetricFamily(
            "speceyes_store_audited_answers",
            "Audited accepted answers, by agreement.",
            labels=["agrees"],
        )
        answers.add_metric(["true"], agreed)
        answers.add_metric(["false"], audited - agreed)
        yield answers
        yield GaugeMetricFamily(
            "speceyes_store_audit_alarms",
            "Batches whose audit drift alarm is raised.",
            value=alarms or 0,
        )
