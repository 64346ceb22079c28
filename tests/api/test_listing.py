"""A calling service finds its work again: ``GET /v1/batches`` and ``GET /v1/jobs``, its
own only, newest first, a cursor page at a time, filtered (issue 46, point 1)."""

from __future__ import annotations

import base64
import itertools
from datetime import UTC, datetime, timedelta

from tests.helpers.api import refused
from tests.helpers.images import png

_COLOURS = itertools.count()  # (a job is its content: each test image its own colour)


def _job() -> dict[str, str]:
    colour = next(_COLOURS)
    image = base64.b64encode(png(colour=(colour % 256, colour // 256, 9))).decode()
    return {"question": "What colour?", "image_base64": image}


def _batch(server, name: str, jobs: int, headers: dict[str, str] | None = None) -> dict:
    body = {"name": name, "jobs": [_job() for _ in range(jobs)]}
    answer = server.http.post("/v1/batches", json=body, headers=headers)
    assert answer.status_code == 202, answer.text
    return answer.json()


def _all_pages(server, path: str, headers: dict[str, str] | None = None, **query) -> list[dict]:
    """Every row of a listing, following its cursors."""
    rows: list[dict] = []
    after = None
    while True:
        params = {**query, **({"after": after} if after else {})}
        page = server.http.get(path, params=params, headers=headers)
        assert page.status_code == 200, page.text
        rows += page.json()["data"]
        after = page.json()["next_cursor"]
        if after is None:
            return rows


def test_batches_are_listed_newest_first_a_page_at_a_time(api):
    server = api()
    made = [_batch(server, f"corpus-{i}", jobs=2)["id"] for i in range(5)]
    assert len(server.http.get("/v1/batches", params={"limit": 1}).json()["data"]) == 1
    first = server.http.get("/v1/batches", params={"limit": 2}).json()
    assert [line["id"] for line in first["data"]] == made[::-1][:2]
    assert first["data"][0]["jobs"] == 2 and first["data"][0]["by_status"] == {"queued": 2}
    assert first["next_cursor"] == made[3]
    assert [line["id"] for line in _all_pages(server, "/v1/batches", limit=2)] == made[::-1]
    named = server.http.get("/v1/batches", params={"name": "corpus-1"}).json()
    assert [line["id"] for line in named["data"]] == [made[1]]
    assert named["next_cursor"] is None


def test_jobs_are_listed_by_status_and_batch_and_pages_never_repeat_a_row(api):
    server = api()
    first = _batch(server, "a", jobs=3)
    second = _batch(server, "b", jobs=4)
    rows = _all_pages(server, "/v1/jobs", limit=3)
    assert [row["id"] for row in rows] == (first["job_ids"] + second["job_ids"])[::-1]
    of_first = _all_pages(server, "/v1/jobs", batch_id=first["id"], limit=2)
    assert {row["id"] for row in of_first} == set(first["job_ids"])
    assert _all_pages(server, "/v1/jobs", status="done") == []
    assert len(_all_pages(server, "/v1/jobs", status="queued")) == 7


def test_a_created_range_cuts_the_listing(api):
    server = api()
    _batch(server, "now", jobs=1)
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    earlier = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    assert _all_pages(server, "/v1/batches", created_from=later) == []
    assert len(_all_pages(server, "/v1/batches", created_from=earlier, created_to=later)) == 1
    assert _all_pages(server, "/v1/jobs", created_to=earlier) == []


def test_a_tenant_lists_only_its_own_and_an_admin_every_tenants(api):
    server = api()
    mine = _batch(server, "mine", jobs=2)
    other = server.key_for("other")
    theirs = _batch(server, "theirs", jobs=1, headers=other)
    seen = _all_pages(server, "/v1/jobs", headers=other)
    assert [row["id"] for row in seen] == theirs["job_ids"]
    assert [b["id"] for b in _all_pages(server, "/v1/batches", headers=other)] == [theirs["id"]]
    # another tenant's batch is as absent as a missing one, as a filter too
    refused(
        server.http.get("/v1/jobs", params={"batch_id": mine["id"]}, headers=other),
        404,
        "batch_not_found",
    )
    admin = server.key_for("ops", admin=True)
    assert len(_all_pages(server, "/v1/jobs", headers=admin)) == 3


def test_bad_listing_requests_get_the_one_error_shape(api):
    server = api()
    refused(server.http.get("/v1/jobs", params={"status": "sleeping"}), 422, "invalid_request")
    refused(server.http.get("/v1/jobs", params={"limit": 0}), 422, "invalid_request")
    refused(server.http.get("/v1/batches", params={"limit": 501}), 422, "invalid_request")
    refused(server.http.get("/v1/jobs", params={"after": "../etc"}), 422, "invalid_cursor")
    refused(server.http.get("/v1/jobs", params={"batch_id": "x"}), 422, "invalid_request")
    refused(
        server.http.get("/v1/batches", params={"created_from": "yesterday"}), 422, "invalid_request"
    )
