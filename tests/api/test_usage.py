"""``GET /v1/usage``: a tenant's jobs, model seconds and tokens by day and stage, its own
only; an admin's, every tenant's or the one it names (issue 50, point 4)."""

from __future__ import annotations

from datetime import UTC, datetime

from tests.helpers.api import refused
from tests.helpers.store import finished_job

DAY_ONE = datetime(2026, 11, 30, 23, 59, tzinfo=UTC)
DAY_TWO = datetime(2026, 12, 1, 0, 1, tzinfo=UTC)


def _finished(server, tenant: str | None, when: datetime, agent_s: float | None) -> None:
    fast = {"seconds": {"screen": 0.25, "speculate": 0.5, "gate": 0.25}, "tokens_in": 10}
    agent = None
    if agent_s is not None:
        agent = {"seconds": {"agent": agent_s, "sandbox": 1.0}, "tokens_out": 7, "steps": 2}
    with server.sessions.begin() as session:
        finished_job(session, tenant, when, fast_usage=fast, agent_usage=agent)


def test_a_tenant_reads_its_own_usage_by_day_and_stage(api):
    server = api(accounting_price_per_gpu_hour=3.6)
    _finished(server, "tests", DAY_ONE, None)
    _finished(server, "tests", DAY_TWO, 3.0)
    _finished(server, "tests", DAY_TWO, 5.0)
    _finished(server, "other", DAY_TWO, 100.0)
    window = {"from": "2026-11-30T00:00:00Z", "to": "2026-12-02T00:00:00Z"}
    answer = server.http.get("/v1/usage", params=window)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["from"].startswith("2026-11-30T00:00") and body["to"].startswith("2026-12-02")
    first, second = body["data"]
    assert (first["day"], first["tenant"], first["jobs"]) == ("2026-11-30", "tests", 1)
    assert first["seconds"] == {"gate": 0.25, "screen": 0.25, "speculate": 0.5}
    assert (second["day"], second["jobs"], second["tokens_in"], second["tokens_out"]) == (
        "2026-12-01",
        2,
        20,
        14,
    )
    assert second["seconds"]["agent"] == 8.0 and second["seconds"]["sandbox"] == 2.0
    assert second["total_s"] == 12.0 and second["cost"] == 0.012  # 3.6 an hour
    # the window is half-open, in UTC: the day-two jobs are outside [from, to) here
    before = server.http.get("/v1/usage", params={**window, "to": "2026-12-01T00:00:00Z"})
    assert [day["day"] for day in before.json()["data"]] == ["2026-11-30"]


def test_an_admin_reads_every_tenants_usage_or_the_one_it_names(api):
    server = api()
    _finished(server, "tests", DAY_TWO, 3.0)
    _finished(server, "other", DAY_TWO, 100.0)
    window = {"from": "2026-12-01T00:00:00Z", "to": "2026-12-02T00:00:00Z"}
    admin = server.key_for("ops", admin=True)
    every = server.http.get("/v1/usage", params=window, headers=admin).json()["data"]
    assert [(day["tenant"], day["jobs"]) for day in every] == [("other", 1), ("tests", 1)]
    named = server.http.get("/v1/usage", params={**window, "tenant": "other"}, headers=admin)
    assert [day["tenant"] for day in named.json()["data"]] == ["other"]
    other = server.key_for("other")
    theirs = server.http.get("/v1/usage", params=window, headers=other).json()["data"]
    assert [(day["tenant"], day["seconds"]["agent"]) for day in theirs] == [("other", 100.0)]
    refused(
        server.http.get("/v1/usage", params={"tenant": "tests"}, headers=other),
        403,
        "tenant_not_allowed",
    )


def test_a_window_that_is_backwards_or_too_long_is_refused(api):
    server = api()
    backwards = {"from": "2026-12-02T00:00:00Z", "to": "2026-12-01T00:00:00Z"}
    refused(server.http.get("/v1/usage", params=backwards), 422, "invalid_request")
    long = {"from": "2024-01-01T00:00:00Z", "to": "2026-12-01T00:00:00Z"}
    refused(server.http.get("/v1/usage", params=long), 422, "invalid_request")
    refused(server.http.get("/v1/usage", params={"from": "yesterday"}), 422, "invalid_request")
