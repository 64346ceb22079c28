"""The /v1 twins of the review pages: a batch's rows filtered and paged, its review
queue, a review, a job's image and an agent's crop; another tenant's are 404."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from api.browse import image_response
from common.config import Settings
from common.errors import NotFound
from common.images import content_hash
from common.sources.locations import parquet_row
from common.sources.reading import _GROUPS, _RECENT
from common.store.tables import Job
from tests.helpers.corpora import image_bytes
from tests.helpers.reviewing import ZOOM_BOX, decided_batch, picture, zoom_trajectory


@pytest.fixture
def decided(api, tmp_path):
    """An app, and a batch of its default key's tenant: an accepted answer, an agent's
    answer with a zoom, a failure."""
    app = api()
    rows = [
        {"answered_by": "small", "final_answer": "yes", "confidence": 0.93, "expected": "yes"},
        {"answered_by": "large", "final_answer": "no", "trajectory": zoom_trajectory("no")},
        {"status": "failed", "error_code": "image_unreadable", "error_message": "corrupt"},
    ]
    batch_id, ids = decided_batch(app.sessions, rows, picture(app.root), tenant="tests")
    return app, batch_id, ids


def test_a_review_is_recorded_with_the_keys_name_and_exported(decided) -> None:
    app, batch_id, ids = decided
    answer = app.http.post(f"/v1/jobs/{ids[1]}/review", json={"answer": "maybe"})
    assert answer.status_code == 200, answer.text
    view = answer.json()
    assert (view["answer"], view["reviewed_answer"], view["final_answer"]) == (
        "no",
        "maybe",
        "maybe",
    )
    assert view["reviewer"] == "tests" and view["reviewed_at"]
    assert app.http.get(f"/v1/jobs/{ids[1]}").json()["final_answer"] == "maybe"
    exported = [
        row for row in app.client.results(batch_id) if row["job_id"] == ids[1]
    ]  # the results stream is the export's rows
    assert exported[0]["reviewed_answer"] == "maybe" and exported[0]["answer"] == "no"


def test_a_review_of_what_cannot_be_reviewed_has_the_one_error_shape(api, tmp_path) -> None:
    app = api()
    _, (running,) = decided_batch(
        app.sessions, [{"status": "running"}], picture(tmp_path), tenant="tests"
    )
    answer = app.http.post(f"/v1/jobs/{running}/review", json={"answer": "yes"})
    assert answer.status_code == 409
    assert answer.json()["error"] == "job_not_finished"
    answer = app.http.post(f"/v1/jobs/{running}/review", json={})
    assert answer.status_code == 422 and set(answer.json()) == {"error", "detail"}


def test_rows_are_filtered_and_paged_by_cursor(decided) -> None:
    app, batch_id, ids = decided
    first = app.http.get(f"/v1/batches/{batch_id}/rows", params={"limit": 2}).json()
    assert [row["job_id"] for row in first["data"]] == ids[:2]
    rest = app.http.get(
        f"/v1/batches/{batch_id}/rows", params={"limit": 2, "after": first["next_cursor"]}
    ).json()
    assert [row["job_id"] for row in rest["data"]] == ids[2:] and rest["next_cursor"] is None
    small = app.http.get(f"/v1/batches/{batch_id}/rows", params={"who": "small"}).json()
    assert [(row["job_id"], row["correct"]) for row in small["data"]] == [(ids[0], True)]
    for params in ({"who": "robot"}, {"conf_min": "2"}, {"after": "zzz"}, {"wrong": "perhaps"}):
        refused = app.http.get(f"/v1/batches/{batch_id}/rows", params=params)
        assert refused.status_code == 422, params
        assert set(refused.json()) == {"error", "detail"}


def test_the_review_queue_lists_what_is_worth_a_look(decided) -> None:
    app, batch_id, ids = decided
    queue = app.http.get(f"/v1/batches/{batch_id}/review-queue").json()["data"]
    assert [(row["job_id"], row["why"]) for row in queue] == [
        (ids[0], "near_threshold"),
        (ids[2], "failed"),
    ]


def test_the_image_and_a_zooms_crop_are_served_as_decoded(decided) -> None:
    app, _, ids = decided
    image = app.http.get(f"/v1/jobs/{ids[1]}/image")
    assert image.headers["content-type"] == "image/png"
    assert image.headers["x-content-type-options"] == "nosniff"
    assert Image.open(io.BytesIO(image.content)).size == (64, 48)  # as it is
    small = app.http.get(f"/v1/jobs/{ids[1]}/image", params={"max_side": 20})
    assert max(Image.open(io.BytesIO(small.content)).size) == 64  # rounded up to 160: whole
    crop = app.http.get(f"/v1/jobs/{ids[1]}/steps/0/crop")
    width, height = ZOOM_BOX[2] - ZOOM_BOX[0], ZOOM_BOX[3] - ZOOM_BOX[1]
    assert Image.open(io.BytesIO(crop.content)).size == (width, height)
    assert app.http.get(f"/v1/jobs/{ids[1]}/steps/1/crop").status_code == 404  # no zoom there


def test_another_tenants_work_is_as_absent_as_a_missing_one(decided) -> None:
    app, batch_id, ids = decided
    other = app.key_for("other", tenant="elsewhere")
    for path in (
        f"/v1/batches/{batch_id}/rows",
        f"/v1/batches/{batch_id}/review-queue",
        f"/v1/jobs/{ids[0]}/image",
        f"/v1/jobs/{ids[1]}/steps/0/crop",
    ):
        assert app.http.get(path, headers=other).status_code == 404, path
    review = app.http.post(f"/v1/jobs/{ids[0]}/review", json={"answer": "no"}, headers=other)
    assert review.status_code == 404
    assert app.http.get(f"/v1/jobs/{ids[0]}").json()["reviewed_answer"] is None
    admin = app.key_for("root", tenant="ops", admin=True)
    assert app.http.get(f"/v1/jobs/{ids[0]}/image", headers=admin).status_code == 200


def test_a_refused_server_path_is_never_served(api, tmp_path) -> None:
    """A batch job naming a server file outside the image roots fails; its job keeps no
    path, so the image routes have nothing to read."""
    secret = picture(tmp_path / "elsewhere")
    app = api()
    made = app.http.post(
        "/v1/batches", json={"jobs": [{"image_path": str(secret), "question": "q?"}]}
    ).json()
    (refused,) = made["refused"]
    assert refused["error"] == "path_outside_roots"
    answer = app.http.get(f"/v1/jobs/{refused['job_id']}/image")
    assert answer.status_code == 404 and str(secret) not in answer.text


def test_an_image_that_cannot_be_read_is_a_404_naming_no_path(decided, tmp_path) -> None:
    app, _, ids = decided
    outside = picture(tmp_path / "outside", name="outside.png")  # a readable image
    with app.sessions.begin() as session:
        session.get(Job, ids[0]).image_path = str(app.root / "gone.png")
        broken = app.root / "broken.png"
        broken.write_bytes(b"not an image at all")
        session.get(Job, ids[1]).image_path = str(broken)
        session.get(Job, ids[2]).image_path = str(outside)  # as an older version kept one
    for job_id, path in ((ids[0], "gone.png"), (ids[1], "broken.png"), (ids[2], "outside")):
        answer = app.http.get(f"/v1/jobs/{job_id}/image")
        assert answer.status_code == 404, answer.text
        assert answer.json()["error"] == "image_unavailable" and path not in answer.text


@pytest.mark.parametrize(
    "params",
    [
        {"after": "p99999999999999999999999"},
        {"after": "p2147483648"},
        {"sort": "confidence", "after": "c0.5:99999999999"},
        {"q": "a\x00b"},
        {"reason": "a\x00b"},
    ],
)
def test_rows_refuse_what_no_column_holds(decided, params: dict) -> None:
    app, batch_id, _ = decided
    answer = app.http.get(f"/v1/batches/{batch_id}/rows", params=params)
    assert answer.status_code == 422 and set(answer.json()) == {"error", "detail"}


def _a_table_rows_job(tmp_path: Path, *, tenant: str | None) -> tuple[Job, Path]:
    """A job whose image is row 0 of a Parquet table (written here), and the table."""
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"image": [image_bytes(1)]}), table)
    job = Job(
        id="j" * 32,
        image_path=parquet_row(str(table), "image", 0, 0),
        image_hash=content_hash(image_bytes(1)),
        tenant=tenant,
    )
    return job, table


def test_a_referenced_image_is_shown_only_as_its_job_read_it(tmp_path) -> None:
    """A job of a corpus read where it lies (a Parquet row here): the page shows those
    pixels, checked by the job's digest; a table rewritten since shows nothing."""
    job, table = _a_table_rows_job(tmp_path, tenant=None)
    shown = image_response(job, Settings())
    assert shown.status_code == 200 and Image.open(io.BytesIO(shown.body)).size == (40, 30)
    pq.write_table(pa.table({"image": [image_bytes(2)]}), table)  # other rows, same place
    _GROUPS.clear(), _RECENT.clear()
    with pytest.raises(NotFound) as refused:
        image_response(job, Settings(), max_side=64)  # (not the one rendered above)
    assert refused.value.code == "image_unavailable"


def test_a_side_asked_beyond_every_rendering_size_gets_the_largest(tmp_path) -> None:
    """A 5000 px wide image asked at 6000: shown at the largest size (4096), never the
    original, nor a smaller size."""
    wide = tmp_path / "wide.png"
    Image.new("RGB", (5000, 400), (200, 30, 30)).save(wide)
    settings = Settings(image_roots=[tmp_path])
    job = Job(id="w" * 32, image_path=str(wide), tenant="tests")
    shown = image_response(job, settings, max_side=6000)
    assert Image.open(io.BytesIO(shown.body)).size[0] == 4096


def test_the_rendered_image_cache_holds_its_bytes_at_most_dropping_the_least_recent(
    tmp_path, monkeypatch
) -> None:
    import api.browse as browse

    settings = Settings(image_roots=[tmp_path])
    jobs = []
    for n in range(3):
        path = tmp_path / f"{n}.png"
        Image.new("RGB", (64, 48), (200, 30, 30)).save(path)  # (one size of rendering)
        jobs.append(Job(id=f"{n}" * 32, image_path=str(path), tenant="tests"))
    monkeypatch.setattr(browse, "_RENDERED", type(browse._RENDERED)())
    monkeypatch.setattr(browse, "_rendered_bytes", 0)
    one = len(image_response(jobs[0], settings).body)
    monkeypatch.setattr(browse, "_RENDERED_MAX_BYTES", 2 * one + one // 2)  # two fit
    for job in (jobs[1], jobs[0], jobs[2]):  # 0 used again after 1: 1 is the least recent
        image_response(job, settings)
    kept = [key[0] for key in browse._RENDERED]
    assert kept == [jobs[0].image_path, jobs[2].image_path]
    assert browse._rendered_bytes == sum(len(body) for body, _ in browse._RENDERED.values())


def test_a_tenants_job_shows_no_image_from_outside_its_uploads_and_roots(tmp_path) -> None:
    """A tenant's job with a path that is no local file (a table row here) shows nothing:
    only uploads and image roots are served to tenants."""
    job, _ = _a_table_rows_job(tmp_path, tenant="tests")
    with pytest.raises(NotFound) as refused:
        image_response(job, Settings(image_roots=[tmp_path]))
    assert refused.value.code == "image_unavailable"
