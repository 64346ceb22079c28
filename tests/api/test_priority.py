"""Priorities through the API (issue 46, point 3): a single job is high by default, a
batch normal; a key may be held to a lower class, and what it may not ask for is a 403
in the one shape."""

from __future__ import annotations

import base64
import itertools

from common.contracts import Priority, Stage
from common.store import claims
from tests.helpers.api import refused
from tests.helpers.images import png

_COLOURS = itertools.count(2000)


def _job(**fields) -> dict:
    colour = next(_COLOURS)
    image = base64.b64encode(png(colour=(colour % 256, colour // 256, 11))).decode()
    return {"question": "What colour?", "image_base64": image, **fields}


def test_a_single_job_overtakes_the_batches_waiting_before_it(api):
    server = api()
    corpus = server.http.post("/v1/batches", json={"jobs": [_job() for _ in range(3)]}).json()
    late = server.http.post("/v1/batches", json={"jobs": [_job()], "priority": "low"}).json()
    single = server.http.post("/v1/jobs", json=_job()).json()
    assert server.http.get(f"/v1/jobs/{single['id']}").json()["priority"] == "high"
    assert server.http.get(f"/v1/jobs/{corpus['job_ids'][0]}").json()["priority"] == "normal"
    with server.sessions.begin() as session:
        order = [ticket.job_id for ticket in claims.claim(session, Stage.FAST, 5)]
    assert order == [single["id"], *corpus["job_ids"], late["job_ids"][0]]


def test_a_key_held_to_normal_sends_at_normal_and_may_not_ask_for_high(api):
    server = api()
    held = server.key_for("bulk", max_priority=Priority.NORMAL)
    single = server.http.post("/v1/jobs", json=_job(), headers=held)
    assert single.status_code == 202, single.text
    assert server.http.get(f"/v1/jobs/{single.json()['id']}", headers=held).json()["priority"] == (
        "normal"
    )
    refused(
        server.http.post("/v1/jobs", json=_job(priority="high"), headers=held),
        403,
        "priority_not_allowed",
    )
    refused(
        server.http.post("/v1/batches", json={"jobs": [_job()], "priority": "high"}, headers=held),
        403,
        "priority_not_allowed",
    )
    low = server.http.post("/v1/jobs", json=_job(priority="low"), headers=held)
    assert server.http.get(f"/v1/jobs/{low.json()['id']}", headers=held).json()["priority"] == "low"
    assert server.jobs() == 2  # nothing was made for the refused requests


def test_an_unknown_priority_is_refused_in_every_form(api):
    server = api()
    refused(server.http.post("/v1/jobs", json=_job(priority="urgent")), 422, "invalid_request")
    refused(
        server.http.post("/v1/batches", json={"jobs": [_job()], "priority": 1}),
        422,
        "invalid_request",
    )
    jsonl = server.http.post(
        "/v1/batches",
        params={"priority": "asap"},
        content=b'{"question": "Q?", "image_path": "x.png"}\n',
        headers={"content-type": "application/x-ndjson"},
    )
    refused(jsonl, 422, "invalid_request")
    upload = server.http.post(
        "/v1/jobs",
        data={"question": "Q?", "priority": "urgent"},
        files={"image": ("a.png", png())},
    )
    refused(upload, 422, "invalid_request")
    assert server.jobs() == 0
