"""Daily quotas per tenant (``api.quotas``): past one, a submission is refused whole with
a 429, ``Retry-After`` and the reason, and nothing of it is kept (issue 50, point 4)."""

from __future__ import annotations

import base64
import itertools

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import OperationalError

from common.store import usage
from common.store.tables import Batch, Job, utcnow
from tests.helpers.api import refused
from tests.helpers.images import png
from tests.helpers.store import finished_job

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
    assert "4 jobs made today (UTC) with this submission's" in over.json()["detail"]
    assert 0 < int(over.headers["Retry-After"]) <= 86_400
    assert _counts(server) == before  # no batch, no job: nothing half-submitted
    assert server.enqueued == first.json()["job_ids"]  # and nothing sent on
    one = server.http.post("/v1/jobs", json=_jobs(1)[0], headers=capped)
    assert one.status_code == 202, one.text  # the third of three
    refused(
        server.http.post("/v1/jobs", json=_jobs(1)[0], headers=capped), 429, "quota_jobs_per_day"
    )
    # the tenant's quota, whichever of its keys submits; another tenant has its own day
    # (the deployment's default: no limit)
    sibling = server.key_for("capped-too", tenant="capped")
    refused(
        server.http.post("/v1/jobs", json=_jobs(1)[0], headers=sibling), 429, "quota_jobs_per_day"
    )
    other = server.key_for("other")
    assert server.http.post("/v1/jobs", json=_jobs(1)[0], headers=other).status_code == 202
    metrics = server.http.get("/metrics").text  # (counters per tenant)
    assert 'speceyes_api_tenant_jobs_submitted_total{tenant="capped"}' in metrics
    assert 'speceyes_api_quota_refused_total{quota="jobs_per_day",tenant="capped"}' in metrics


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
        used = {"seconds": {"screen": 1.0, "agent": 4.5}}
        finished_job(session, "spender", utcnow(), agent_usage=used)
    before = _counts(server)
    over = server.http.post("/v1/batches", json={"name": "c", "jobs": _jobs(3)}, headers=capped)
    refused(over, 429, "quota_compute_per_day")
    assert "5.5 model seconds used today" in over.json()["detail"]
    assert _counts(server) == before
    metrics = server.http.get("/metrics").text
    assert 'speceyes_api_quota_refused_total{quota="compute_s_per_day",tenant="spender"}' in metrics


def test_a_retry_past_the_compute_quota_is_refused_and_changes_nothing(api):
    server = api()
    spender = server.key_for("retrier", compute_s_per_day=5.0)
    made = server.http.post("/v1/batches", json={"name": "d", "jobs": _jobs(2)}, headers=spender)
    assert made.status_code == 202, made.text
    with server.sessions.begin() as session:  # both failed, having used 6 s today
        for job_id in made.json()["job_ids"]:
            job = session.get(Job, job_id)
            job.status, job.error_code, job.finished_at = "failed", "model_error", utcnow()
            job.agent_usage = {"seconds": {"agent": 3.0}}
    batch_id = made.json()["id"]
    refused(
        server.http.post(f"/v1/batches/{batch_id}/retry", headers=spender),
        429,
        "quota_compute_per_day",
    )
    one = made.json()["job_ids"][0]
    refused(
        server.http.post(f"/v1/jobs/{one}/retry", headers=spender), 429, "quota_compute_per_day"
    )
    with server.sessions() as session:
        assert {session.get(Job, j).status for j in made.json()["job_ids"]} == {"failed"}


def test_one_tenants_quota_checks_wait_for_each_other(api):
    """Two submissions of one tenant at once: the second's check waits for the first's
    transaction (the tenant's lock), so both never count the day without the other."""
    server = api()  # (on PostgreSQL: SQLite has one writer at a time already)
    assert server.sessions.engine.dialect.name == "postgresql"

    with server.sessions.begin() as first:
        usage.lock_tenant(first, "busy")
        with server.sessions() as second:
            second.execute(text("SET LOCAL lock_timeout = '200ms'"))
            with pytest.raises(OperationalError):
                usage.lock_tenant(second, "busy")
            second.rollback()
            usage.lock_tenant(second, "idle")  # another tenant's: free


def test_with_a_broker_a_refused_submission_sends_nothing(api, broker_env):
    """Distributed mode: the jobs a refused submission would have made are neither kept
    nor sent (the broker's queue holds the accepted submission's messages only)."""
    server = api(
        broker_url=broker_env["SPECEYES_BROKER_URL"],
        broker_key_prefix=broker_env["SPECEYES_BROKER_KEY_PREFIX"],
        fast_queue=broker_env["SPECEYES_FAST_QUEUE"],
        slow_queue=broker_env["SPECEYES_SLOW_QUEUE"],
    )
    capped = server.key_for("queued", jobs_per_day=2)
    made = server.http.post("/v1/batches", json={"name": "e", "jobs": _jobs(2)}, headers=capped)
    assert made.status_code == 202, made.text
    queue = broker_env["SPECEYES_FAST_QUEUE"]
    waiting = server.dispatcher.queue_depth(queue)
    assert waiting >= 1
    before = _counts(server)
    over = server.http.post("/v1/batches", json={"name": "f", "jobs": _jobs(3)}, headers=capped)
    refused(over, 429, "quota_jobs_per_day")
    refused(
        server.http.post("/v1/jobs", json=_jobs(1)[0], headers=capped), 429, "quota_jobs_per_day"
    )
    assert _counts(server) == before and server.dispatcher.queue_depth(queue) == waiting
