"""Webhooks through the API (issue 46, point 4): a tenant registers endpoints and reads
its deliveries with each try; a job or batch names a callback URL; the app's own sender
delivers, signed; bad URLs are refused in the one error shape."""

from __future__ import annotations

import base64
import itertools

import pytest
from standardwebhooks import Webhook

from api.client import InvalidRequest, NotFound
from common.config import GateSettings
from common.contracts import Accepted, ScreenResult, Stage
from common.store import claims
from tests.helpers.api import refused
from tests.helpers.images import png
from tests.helpers.receiver import receiver
from tests.helpers.waiting import wait_until

_COLOURS = itertools.count(3000)
QUICK = {
    "webhook_allow_hosts": ["127.0.0.1"],
    "webhook_poll_s": 0.05,
    "webhook_first_retry_s": 0.05,
    "webhook_max_retry_s": 0.2,
    "webhook_timeout_s": 2.0,
}


def _job(**fields) -> dict:
    colour = next(_COLOURS)
    image = base64.b64encode(png(colour=(colour % 256, colour // 256, 9))).decode()
    return {"question": "What colour?", "image_base64": image, **fields}


def _answer_waiting(server) -> None:
    with server.sessions.begin() as session:
        tickets = claims.claim(session, Stage.FAST, 100)
        done = [Accepted(t.job_id, "red", 0.99, [9.0], ScreenResult(False, "no")) for t in tickets]
        claims.record_fast(session, done, GateSettings())


def test_an_endpoint_hears_a_job_and_a_batch_end_and_its_deliveries_are_listed(api):
    server = api(**QUICK)
    with receiver() as hook:
        hook.script.append(("status", 500))  # the first try fails: kept, and tried again
        made = server.http.post("/v1/webhooks", json={"url": hook.url})
        assert made.status_code == 201, made.text
        endpoint = made.json()
        assert endpoint["events"] == [
            "job.finished",
            "batch.finished",
            "batch.cancelled",
            "audit.alarm",
        ]
        assert endpoint["secret"].startswith("whsec_")
        job = server.http.post("/v1/jobs", json=_job()).json()
        batch = server.http.post("/v1/batches", json={"name": "b", "jobs": [_job()]}).json()
        _answer_waiting(server)
        seen = wait_until(
            lambda: len({r.headers["webhook-id"] for r in hook.received}) == 2 and hook.received,
            deadline_s=30,
            what=lambda: hook.received,
        )
        bodies = {}
        for request in seen:
            body = Webhook(endpoint["secret"]).verify(request.body, request.headers)
            bodies[body["type"]] = body["data"]
        assert bodies["job.finished"]["id"] == job["id"]
        assert bodies["job.finished"]["answer"] == "red"
        assert bodies["batch.finished"]["id"] == batch["id"]
        assert bodies["batch.finished"]["counts"] == {"done": 1}

        def delivered() -> list:
            page = server.http.get("/v1/webhooks/deliveries").json()["data"]
            return page if page and all(d["state"] == "delivered" for d in page) else []

        listed = wait_until(delivered, deadline_s=30)
        assert {d["event_type"] for d in listed} == {"job.finished", "batch.finished"}
        tries = [len(d["attempts"]) for d in listed]
        assert sorted(tries) == [1, 2]  # the one that met the 500 tried twice
        failed_first = next(d for d in listed if len(d["attempts"]) == 2)
        assert failed_first["attempts"][0]["status_code"] == 500
        assert failed_first["attempts"][1]["error"] is None
    # another tenant sees none of it, and cannot remove the endpoint
    other = server.key_for("other", tenant="other")
    assert server.http.get("/v1/webhooks", headers=other).json() == {"data": []}
    assert server.http.get("/v1/webhooks/deliveries", headers=other).json()["data"] == []
    refused(
        server.http.delete(f"/v1/webhooks/{endpoint['id']}", headers=other),
        404,
        "endpoint_not_found",
    )
    assert server.http.delete(f"/v1/webhooks/{endpoint['id']}").status_code == 204
    assert server.http.get("/v1/webhooks").json() == {"data": []}


def test_a_callback_url_on_a_job_hears_its_end_signed_with_the_callback_secret(api):
    server = api(**QUICK)
    with receiver() as hook:
        secret = server.http.get("/v1/webhooks/secret").json()["secret"]
        job = server.http.post("/v1/jobs", json=_job(callback_url=hook.url)).json()
        cancelled = server.http.post(f"/v1/jobs/{job['id']}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        (request,) = wait_until(lambda: hook.received, deadline_s=30)
        body = Webhook(secret).verify(request.body, request.headers)
        assert body["type"] == "job.finished"
        assert (body["data"]["id"], body["data"]["status"]) == (job["id"], "cancelled")


def test_bad_callback_urls_and_events_are_refused_in_the_one_shape(api):
    server = api()  # (no host allowed)
    for url, error in (
        ("not a url", "invalid_callback_url"),
        ("ftp://hooks.example/", "invalid_callback_url"),
        ("http://127.0.0.1:9/", "callback_url_refused"),
        ("http://169.254.169.254/latest/meta-data/", "callback_url_refused"),
        ("http://[::1]/", "callback_url_refused"),
        ("http://a..b/", "invalid_callback_url"),
    ):
        refused(server.http.post("/v1/webhooks", json={"url": url}), 422, error)
        refused(server.http.post("/v1/jobs", json=_job(callback_url=url)), 422, error)
        batch = {"name": "b", "jobs": [_job()], "callback_url": url}
        refused(server.http.post("/v1/batches", json=batch), 422, error)
    # a lone surrogate, escaped in the JSON as a caller may send it: 422, not a 500
    surrogate = b'{"url": "https://ex\\ud800.com/"}'
    headers = {"content-type": "application/json"}
    answer = server.http.post("/v1/webhooks", content=surrogate, headers=headers)
    refused(answer, 422, "invalid_callback_url")
    unknown = {"url": "https://hooks.example/", "events": ["job.started"]}
    refused(server.http.post("/v1/webhooks", json=unknown), 422, "invalid_request")
    refused(server.http.delete("/v1/webhooks/nope"), 422, "invalid_request")
    # a job of a batch names none of its own: that row fails alone
    batch = {"name": "b", "jobs": [_job(), _job(callback_url="https://hooks.example/")]}
    answer = server.http.post("/v1/batches", json=batch)
    assert answer.status_code == 202, answer.text
    (row,) = answer.json()["refused"]
    assert (row["index"], row["error"]) == (1, "invalid_request")
    assert server.jobs() == 2
    # nor does a job added to a batch by POST /v1/jobs
    added = _job(batch_id=answer.json()["id"], callback_url="https://hooks.example/")
    refused(server.http.post("/v1/jobs", json=added), 422, "invalid_request")
    # one URL per endpoint
    assert server.http.post("/v1/webhooks", json={"url": "https://a.example/"}).status_code == 201
    refused(
        server.http.post("/v1/webhooks", json={"url": "https://a.example/"}), 422, "endpoint_exists"
    )


def test_the_python_client_registers_lists_and_removes_endpoints(api):
    server = api()
    client = server.client
    made = client.add_webhook("https://hooks.example/a", ["batch.finished"])
    assert made["events"] == ["batch.finished"] and made["secret"].startswith("whsec_")
    assert [endpoint["id"] for endpoint in client.webhooks()] == [made["id"]]
    assert client.webhook_secret().startswith("whsec_")
    assert list(client.deliveries()) == []
    with pytest.raises(InvalidRequest):
        client.add_webhook("http://127.0.0.1/")
    client.remove_webhook(made["id"])
    assert client.webhooks() == []
    with pytest.raises(NotFound):
        client.remove_webhook(made["id"])
