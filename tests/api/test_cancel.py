"""A calling service cancels, resumes and retries its work through the API (issue 46,
points 2 and 5): what finished is kept and exported, running jobs stop at the end of
their step, a second cancel changes nothing, and every refusal has the one shape."""

from __future__ import annotations

import base64
import itertools
import json

import pytest

from api.client import Conflict
from common.config import GateSettings
from common.contracts import Accepted, ScreenResult, Stage
from common.store import claims
from tests.helpers.api import refused
from tests.helpers.images import png

_COLOURS = itertools.count(1000)


def _job() -> dict[str, str]:
    colour = next(_COLOURS)
    image = base64.b64encode(png(colour=(colour % 256, colour // 256, 77))).decode()
    return {"question": "What colour?", "image_base64": image}


def _batch(server, jobs: list[dict], headers: dict[str, str] | None = None) -> dict:
    answer = server.http.post("/v1/batches", json={"name": "c", "jobs": jobs}, headers=headers)
    assert answer.status_code == 202, answer.text
    return answer.json()


def _one_done_one_running(server) -> tuple[str, str]:
    """Two of the queued jobs claimed; the first answered by the gate, the second left
    running (a micro-batch under way)."""
    with server.sessions.begin() as session:
        done, running = claims.claim(session, Stage.FAST, 2)
        accepted = Accepted(done.job_id, "red", 0.99, [9.0], ScreenResult(False, "no"))
        claims.record_fast(session, [accepted], GateSettings())
    return done.job_id, running.job_id


def test_a_batch_cancel_keeps_what_finished_and_stops_the_rest(api):
    server = api()
    batch = _batch(server, [_job() for _ in range(4)])
    done, running = _one_done_one_running(server)
    first = server.http.post(f"/v1/batches/{batch['id']}/cancel")
    assert first.status_code == 200, first.text
    assert first.json() == {"id": batch["id"], "cancelled": 2, "stopping": 1, "kept": 1}
    again = server.http.post(f"/v1/batches/{batch['id']}/cancel").json()
    assert (again["cancelled"], again["stopping"], again["kept"]) == (0, 1, 3)
    view = server.http.get(f"/v1/batches/{batch['id']}").json()
    assert view["by_status"] == {"done": 1, "running": 1, "cancelled": 2}
    assert view["cancelled"] == {"cancelled": 2} and view["finished"] == 3
    job = server.http.get(f"/v1/jobs/{running}").json()
    assert (job["status"], job["cancelling"]) == ("running", True)
    rows = [
        json.loads(line)
        for line in server.http.get(f"/v1/batches/{batch['id']}/results").text.splitlines()
    ]
    by_status = {row["job_id"]: (row["status"], row["answer"], row["error"]) for row in rows}
    assert by_status[done] == ("done", "red", None)
    cancelled = [value for value in by_status.values() if value[0] == "cancelled"]
    assert cancelled == [("cancelled", None, "cancelled by its caller")] * 2
    listed = server.http.get("/v1/jobs", params={"status": "cancelled"}).json()["data"]
    assert len(listed) == 2


def test_a_job_cancel_is_idempotent_and_a_finished_job_is_refused(api):
    server = api()
    batch = _batch(server, [_job() for _ in range(3)])
    done, _ = _one_done_one_running(server)
    waiting = batch["job_ids"][2]
    first = server.http.post(f"/v1/jobs/{waiting}/cancel")
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["status"] == "cancelled"
    assert body["error"] == {"code": "cancelled", "message": "cancelled by its caller"}
    assert server.http.post(f"/v1/jobs/{waiting}/cancel").json()["status"] == "cancelled"
    refused(server.http.post(f"/v1/jobs/{done}/cancel"), 409, "already_finished")
    assert server.http.get(f"/v1/jobs/{done}").json()["answer"] == "red"


def test_another_tenants_work_cannot_be_cancelled_resumed_or_retried(api):
    server = api()
    batch = _batch(server, [_job()])
    other = server.key_for("other")
    for path in ("cancel", "resume", "retry"):
        answer = server.http.post(f"/v1/batches/{batch['id']}/{path}", headers=other)
        refused(answer, 404, "batch_not_found")
    refused(
        server.http.post(f"/v1/jobs/{batch['job_ids'][0]}/cancel", headers=other),
        404,
        "job_not_found",
    )
    assert server.http.get(f"/v1/jobs/{batch['job_ids'][0]}").json()["status"] == "queued"


def test_a_resumed_batch_runs_its_cancelled_jobs_and_not_its_done_ones(api):
    server = api()
    batch = _batch(server, [_job() for _ in range(3)])
    done, running = _one_done_one_running(server)
    server.http.post(f"/v1/batches/{batch['id']}/cancel")
    with server.sessions.begin() as session:  # the micro-batch ends: released, so cancelled
        claims.release_ids(session, [running], Stage.FAST, count_attempt=False)
    server.dispatcher.sent_fast.clear()
    resumed = server.http.post(f"/v1/batches/{batch['id']}/resume")
    assert resumed.status_code == 200, resumed.text
    again = set(batch["job_ids"]) - {done}
    assert set(resumed.json()["job_ids"]) == again and resumed.json()["requeued"] == 2
    assert set(server.enqueued) == again  # sent, after the commit
    view = server.http.get(f"/v1/batches/{batch['id']}").json()
    assert view["by_status"] == {"done": 1, "queued": 2}
    nothing = server.http.post(f"/v1/batches/{batch['id']}/resume").json()
    assert nothing["requeued"] == 0


def test_retry_runs_only_the_failed_rows_and_says_when_there_are_none(api):
    server = api()
    broken = {"question": "What colour?", "image_base64": base64.b64encode(b"not a png").decode()}
    batch = _batch(server, [_job(), _job(), broken])
    with server.sessions.begin() as session:  # one fails in the fast stage
        (ticket,) = claims.claim(session, Stage.FAST, 1)
        claims.fail_running(session, ticket.job_id, Stage.FAST, "model_error", "boom")
    refused(
        server.http.post(f"/v1/batches/{batch['id']}/retry", params={"error": "image_missing"}),
        409,
        "nothing_to_retry",
    )
    server.dispatcher.sent_fast.clear()
    retried = server.http.post(f"/v1/batches/{batch['id']}/retry")
    assert retried.status_code == 200, retried.text
    # the job refused at intake (its image never kept) is not run again: it could only fail
    assert retried.json()["job_ids"] == [ticket.job_id]
    assert ticket.job_id in server.enqueued  # (with what else of the batch waits)
    refused(server.http.post(f"/v1/batches/{batch['id']}/retry"), 409, "nothing_to_retry")
    refused(server.http.post("/v1/batches/not-an-id/retry"), 422, "invalid_request")


def test_the_python_client_lists_cancels_and_retries(api):
    server = api()
    batch = _batch(server, [_job() for _ in range(2)])
    done, _ = _one_done_one_running(server)
    assert {job["id"] for job in server.client.jobs(batch_id=batch["id"])} == set(batch["job_ids"])
    assert [line["id"] for line in server.client.batches()] == [batch["id"]]
    with pytest.raises(Conflict) as refused_cancel:
        server.client.cancel(done)
    assert refused_cancel.value.error == "already_finished"
    assert server.client.cancel_batch(batch["id"])["stopping"] == 1
    with pytest.raises(Conflict):
        server.client.retry_batch(batch["id"], error="model_error")
    with server.sessions.begin() as session:  # the running micro-batch ends: cancelled
        claims.release_running(session)
    assert server.client.retry_batch(batch["id"])["requeued"] == 1


def _broken() -> dict[str, str]:
    return {"question": "What colour?", "image_base64": base64.b64encode(b"not a png").decode()}


def test_a_batch_failing_past_its_budget_stops_and_retry_runs_its_failed_rows(api):
    server = api()
    jobs = [_broken() for _ in range(4)] + [_job() for _ in range(6)]
    body = {"jobs": jobs, "max_failure_rate": 0.25, "failure_budget_after": 4}
    batch = server.http.post("/v1/batches", json=body).json()
    view = server.http.get(f"/v1/batches/{batch['id']}").json()
    # its four broken images failed at intake: 4 of 4 finished, over 25%: the rest stops
    assert view["by_status"] == {"failed": 4, "cancelled": 6}, view
    assert view["cancelled"] == {"failure_budget": 6}
    assert view["stopped"].startswith("failure_budget: 4 of 4 finished jobs failed")
    assert server.enqueued == []  # nothing of it was sent
    retried = server.http.post(
        f"/v1/batches/{batch['id']}/retry", params={"error": "failure_budget"}
    )
    assert retried.json()["requeued"] == 6
    view = server.http.get(f"/v1/batches/{batch['id']}").json()
    assert view["by_status"] == {"failed": 4, "queued": 6} and view["stopped"] is None


def test_a_budget_waits_for_its_count_and_a_batch_within_it_runs_on(api):
    server = api()
    body = {"jobs": [_broken(), *(_job() for _ in range(5))], "max_failure_rate": 0.5}
    batch = server.http.post("/v1/batches", json=body).json()  # 1 of 1 failed, under 10
    view = server.http.get(f"/v1/batches/{batch['id']}").json()
    assert view["by_status"] == {"failed": 1, "queued": 5} and view["stopped"] is None
    refused(
        server.http.post("/v1/batches", json={"jobs": [_job()], "failure_budget_after": 3}),
        422,
        "invalid_request",
    )
    refused(
        server.http.post("/v1/batches", json={"jobs": [_job()], "max_failure_rate": 1.5}),
        422,
        "invalid_request",
    )


def test_a_job_sent_alone_is_retried_alone(api):
    server = api()
    job_id = server.http.post("/v1/jobs", json=_job()).json()["id"]
    refused(server.http.post(f"/v1/jobs/{job_id}/retry"), 409, "nothing_to_retry")  # waiting
    assert server.http.post(f"/v1/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    server.dispatcher.sent_fast.clear()
    again = server.http.post(f"/v1/jobs/{job_id}/retry")
    assert again.status_code == 200, again.text
    assert (again.json()["status"], again.json()["error"]) == ("queued", None)
    assert server.enqueued == [job_id]
    server.client.cancel(job_id)
    assert server.client.retry(job_id)["status"] == "queued"
    other = server.key_for("other")
    refused(server.http.post(f"/v1/jobs/{job_id}/retry", headers=other), 404, "job_not_found")
