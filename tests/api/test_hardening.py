"""The API under hostile input, between tenants, and over its rates (real PostgreSQL)."""

from __future__ import annotations

import base64
import json

from fastapi.testclient import TestClient
from sqlalchemy import select

from common.store.tables import Job
from tests.helpers.api import refused, upload
from tests.helpers.images import png

B64 = base64.b64encode(png()).decode()


def test_text_postgresql_cannot_store_is_refused_with_422_and_creates_nothing(api):
    server = api()
    refused(upload(server, png(), question="What\x00colour?"), 422, "invalid_text")
    refused(upload(server, png(), id="row\x00"), 422, "invalid_text")
    job = {"question": "Q?", "image_base64": B64}
    refused(server.http.post("/v1/jobs", json={**job, "id": "a\x00b"}), 422, "invalid_text")
    refused(
        server.http.post("/v1/jobs", json={"question": "Q?", "image_path": "/x\x00.png"}),
        422,
        "invalid_text",
    )
    # a lone surrogate, as JSON can carry it
    lone = b'{"question": "Q\\ud800?", "image_base64": "' + B64.encode() + b'"}'
    refused(
        server.http.post("/v1/jobs", content=lone, headers={"content-type": "application/json"}),
        422,
        "invalid_text",
    )
    named = server.http.post("/v1/batches", json={"name": "n" * 201, "jobs": [job]})
    refused(named, 413, "max_name_chars")
    many = server.http.post("/v1/jobs", json={**job, "options": ["o"] * 10_000})
    refused(many, 413, "max_options")
    assert server.jobs() == 0


def test_a_jsonl_batchs_unreadable_line_fails_its_row_alone(api):
    """One rule for every batch: a JSONL line that is not JSON (or nested too deep) fails
    its own row with the reason, as a bad job of a JSON batch and a CLI manifest's row do;
    the other lines are jobs."""
    server = api()
    good = json.dumps({"question": "Q?", "image_base64": B64})
    body = "\n".join([good, '{"question": "Q?", "image_base64": ', "[" * 5000 + "]" * 5000, good])
    answer = server.http.post(
        "/v1/batches?name=lines", content=body, headers={"content-type": "application/x-ndjson"}
    )
    assert answer.status_code == 202, answer.text
    rows = server.http.get(f"/v1/batches/{answer.json()['id']}/rows").json()["data"]
    assert [row["status"] for row in rows] == ["queued", "failed", "failed", "queued"]
    assert [row["error_code"] for row in rows[1:3]] == ["invalid_jsonl", "invalid_jsonl"]
    said = [server.http.get(f"/v1/jobs/{row['job_id']}").json()["error"] for row in rows[1:3]]
    assert said[0]["message"].startswith("line 2: ")
    assert said[1] == {"code": "invalid_jsonl", "message": "line 3: nested too deep"}


def test_unexpected_errors_answer_in_the_one_json_shape(api, monkeypatch):
    server = api()
    deep = b"[" * 5000 + b"]" * 5000
    refused(
        server.http.post("/v1/batches", content=deep, headers={"content-type": "application/json"}),
        422,
        "invalid_json",
    )

    from common.store import submission

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(submission, "submit_job", broken)
    plain = TestClient(server.http.app, raise_server_exceptions=False)
    answer = plain.post(
        "/v1/jobs", json={"question": "Q?", "image_base64": B64}, headers=dict(server.http.headers)
    )
    refused(answer, 500, "internal_error")
    assert "a bug" not in answer.text  # no internals to the client


def test_a_chunked_body_over_the_limit_is_refused(api):
    server = api(max_request_bytes=100_000)

    def chunks():
        for _ in range(50):
            yield b"x" * 10_000  # 500 kB, no Content-Length

    response = server.http.post(
        "/v1/batches", content=chunks(), headers={"content-type": "application/json"}
    )
    assert "content-length" not in response.request.headers  # nothing declared
    refused(response, 413, "max_request_bytes")


def test_each_tenant_reads_only_its_own_work(api, tmp_path):
    server = api()
    alice, bob = server.key_for("alice"), server.key_for("bob")
    admin = server.key_for("ops", admin=True)
    (server.root / "shared.png").write_bytes(png(colour=(1, 2, 3)))
    job = {"question": "Q?", "image_base64": B64, "idempotency_key": "same"}
    mine = server.http.post("/v1/jobs", json=job, headers=alice).json()
    theirs = server.http.post("/v1/jobs", json=job, headers=bob).json()
    assert mine["created"] and theirs["created"] and mine["id"] != theirs["id"]  # keys scoped
    batch = server.http.post(
        "/v1/batches",
        headers=alice,
        json={
            "jobs": [
                {"question": "Q?", "image_base64": B64},
                {"question": "Q?", "image_path": str(server.root / "shared.png")},
            ]
        },
    ).json()
    other = server.http.post(
        "/v1/batches", headers=bob, json={"jobs": [{"question": "Q?", "image_base64": B64}]}
    ).json()
    assert set(other["job_ids"]).isdisjoint(batch["job_ids"])  # the same request, two jobs
    reads = {
        f"/v1/jobs/{mine['id']}": "job_not_found",
        f"/v1/jobs/{mine['id']}/trace": "job_not_found",
        f"/v1/batches/{batch['id']}": "batch_not_found",
        f"/v1/batches/{batch['id']}/results": "batch_not_found",
    }
    for path, not_found in reads.items():
        assert server.http.get(path, headers=alice).status_code == 200, path
        refused(server.http.get(path, headers=bob), 404, not_found)  # as if it did not exist
        assert server.http.get(path, headers=admin).status_code == 200, path
    append = {"question": "Q?", "image_base64": B64, "batch_id": batch["id"]}
    refused(server.http.post("/v1/jobs", json=append, headers=bob), 404, "batch_not_found")
    rows = server.http.get(f"/v1/batches/{batch['id']}/results", headers=alice).text
    first, second = map(json.loads, rows.splitlines())
    assert first["image"] is None and "uploads" not in rows  # where uploads live is private
    assert second["image"] == str(server.root / "shared.png")  # a path the client named


def test_an_idempotency_key_names_one_batch_per_tenant(api):
    """Two tenants that happen to pick the same Idempotency-Key each get a batch of their
    own, with jobs of their own; each repeat answers its own tenant's batch."""
    server = api()
    alice, bob = server.key_for("alice"), server.key_for("bob")
    body = {"jobs": [{"question": "Q?", "image_base64": B64}]}

    def send(who: dict[str, str]) -> dict:
        answer = server.http.post(
            "/v1/batches", json=body, headers={**who, "Idempotency-Key": "nightly-1"}
        )
        assert answer.status_code == 202, answer.text
        return answer.json()

    mine, theirs = send(alice), send(bob)
    assert mine["created"] and theirs["created"] and mine["id"] != theirs["id"]
    assert set(mine["job_ids"]).isdisjoint(theirs["job_ids"])
    for job_id in theirs["job_ids"]:  # bob's jobs exist, and are bob's
        assert server.http.get(f"/v1/jobs/{job_id}", headers=bob).status_code == 200
        refused(server.http.get(f"/v1/jobs/{job_id}", headers=alice), 404, "job_not_found")
    again = send(bob)
    assert (again["id"], again["created"], again["job_ids"]) == (
        theirs["id"],
        False,
        theirs["job_ids"],
    )


def test_work_from_before_tenants_is_read_by_an_admin_only(api):
    server = api()
    with server.sessions.begin() as session:
        from common.store import new_jobs, submission

        made = submission.submit_job(
            session, new_jobs.NewItem(0, "x", "Q?"), client_key=None, batch_id=None
        )
    refused(server.http.get(f"/v1/jobs/{made.id}"), 404, "job_not_found")
    admin = server.key_for("ops", admin=True)
    assert server.http.get(f"/v1/jobs/{made.id}", headers=admin).status_code == 200


def test_rates_and_quotas_answer_429_with_retry_after(api):
    server = api(
        api_rate_per_s=0.5, api_rate_burst=3, api_max_jobs_in_flight=2, api_auth_failures_per_min=5
    )
    job = {"question": "Q?", "image_base64": B64}
    answers = [server.http.post("/v1/jobs", json=job).status_code for _ in range(3)]
    assert answers == [202, 202, 429]  # the quota: 2 unfinished jobs per tenant
    limited = server.http.get("/v1/jobs/" + "ab" * 16)  # the 4th request in a burst of 3
    refused(limited, 429, "rate_limited")
    assert int(limited.headers["retry-after"]) >= 1
    other = server.key_for("other")  # another tenant, with its own quota
    three = [{**job, "question": f"Q{i}?"} for i in range(3)]
    batch = server.http.post("/v1/batches", json={"jobs": three}, headers=other)
    refused(batch, 429, "max_jobs_in_flight")
    with server.sessions() as session:
        assert len(session.scalars(select(Job)).all()) == 2  # the refused batch made nothing
    anonymous = TestClient(server.http.app)
    wrong = [
        anonymous.get("/v1/jobs/" + "0" * 32, headers={"X-API-Key": f"sk-{i}"}) for i in range(8)
    ]
    assert [r.status_code for r in wrong] == [401] * 5 + [429] * 3
    assert int(wrong[-1].headers["retry-after"]) >= 1
    # then a valid key is turned away from that address too, and the answer says why
    valid = anonymous.get("/v1/jobs/" + "0" * 32, headers={"X-API-Key": server.key})
    refused(valid, 429, "auth_failures")
    detail = valid.json()["detail"]
    assert "over 5 failed authentications a minute from this address" in detail
    assert "every key is refused from here until the wait is over, a valid one too" in detail
