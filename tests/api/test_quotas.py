"""Daily quotas per tenant (``api.quotas``): past one, a submission is refused whole with
a 429, ``Retry-After`` and the reason, and nothing of it is kept (issue 50, point 4)."""

from __future__ import annotations

import base64
import itertools
import uuid

from sqlalchemy import func, select

from common.store.tables import Batch, Job, utcnow
from tests.helpers.api import refused
from tests.helpers.images import png

_COLOURS = itertools.count(1000)


def _jobs(count: int) -> list[dict[str, str]]:
    made = []
    for _ in range(count):
        colour = next(_COLOURS)
        image = base64.b64encode(png(colour=(colour % 256, colour // 256, 3))).decode()
        made.append({"question": "What colour?", "image_base64": image})
    return made


def _counts(server) -> tuple[int, int]:
    with server.sessions() as session:
        jobs = session.scalar(select(func.count()).select_from(Job)) or 0
        batches = session.scalar(select(func.count()).select_from(Batch)) or 0
    return jobs, batches


def test_a_submission_past_the_jobs_quota_is_refused_whole(api):
    server = api()
    capped = server.key_for("capped", jobs_per_day=3)
    first = server.http.post("/v1/batches", json={"name": "a", "jobs": _jobs(2)}, headers=capped)
    assert first.status_code == 202, first.text
    before = _counts(server)
    over = server.http.post("/v1/batches", json={"name": "b", "jobs": _jobs(2)}, headers=capped)
    refused(over, 429, "quota_jobs_per_day")
    assert "2 jobs submitted today (UTC) and 2 new" in over.json()["detail"]
    assert 0 < int(over.headers["Retry-After"]) <= 86_400
    assert _counts(server) == before  # no batch, no job: nothing half-submitted
    assert server.enqueued == first.json()["job_ids"]  # and nothing sent on
    one = server.http.post("/v1/jobs", json=_jobs(1)[0], headers=capped)
    assert one.status_code == 202, one.text  # the third of three
    refused(
        server.http.post("/v1/jobs", json=_jobs(1)[0], headers=capped), 429, "quota_jobs_per_day"
    )
    # another tenant has its own day; the deployment's default is no limit
    other = server.key_for("other")
    assert server.http.post("/v1/jobs", json=_jobs(1)[0], headers=other).status_code == 202


def test_the_deployments_quota_applies_where_a_key_sets_none(api):
    server = api(accounting_max_jobs_per_day=1)
    assert server.http.post("/v1/jobs", json=_jobs(1)[0]).status_code == 202
    refused(server.http.post("/v1/jobs", json=_jobs(1)[0]), 429, "quota_jobs_per_day")
    generous = server.key_for("generous", jobs_per_day=10)  # a key's own wins
    assert server.http.post("/v1/jobs", json=_jobs(1)[0], headers=generous).status_code == 202


def test_once_the_compute_quota_is_spent_submissions_wait_for_the_next_day(api):
    server = api()
    capped = server.key_for("spender", compute_s_per_day=5.0)
    with server.sessions.begin() as session:  # a job of the tenant's that finished today
        key = uuid.uuid4().hex
        used = {"seconds": {"screen": 1.0, "agent": 4.5}}
        session.add(
            Job(
                id=key,
                idempotency_key=key,
                question="Q?",
                status="done",
                tenant="spender",
                finished_at=utcnow(),
                agent_usage=used,
            )
        )
    before = _counts(server)
    over = server.http.post("/v1/batches", json={"name": "c", "jobs": _jobs(3)}, headers=capped)
    refused(over, 429, "quota_compute_per_day")
    assert "5.5 model seconds used today" in over.json()["detail"]
    assert _counts(server) == before
    metrics = server.http.get("/metrics").text
    assert 'speceyes_api_quota_refused_total{quota="compute_s_per_day",tenant="spender"}' in metrics
