"""The review pages over HTTP (no browser): sign-in and its cookie, CSRF, the security
headers, tenancy, escaping, and that a page changes what /v1 reads."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from markupsafe import escape
from PIL import Image

from common.store.keys import create_key, revoke_key
from tests.helpers.api import upload
from tests.helpers.images import png
from tests.helpers.reviewing import decided_batch, picture, zoom_trajectory
from tests.helpers.ui import form_token, sign_in

XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>'


@pytest.fixture
def site(api, tmp_path):
    """An app; a browser-like client of it (no API key header) signed in with its key;
    a decided batch of that key's tenant."""
    app = api()
    rows = [
        {"answered_by": "small", "final_answer": "yes", "confidence": 0.93, "expected": "yes"},
        {
            "answered_by": "large",
            "final_answer": XSS,
            "question": f"question {XSS}",
            "options": [XSS, "plain"],
            "trajectory": zoom_trajectory("A", text=f"thinking {XSS}"),
        },
        {  # reviewed: the corrected answer and the reviewer's name are what users wrote
            "answered_by": "small",
            "final_answer": "yes",
            "confidence": 0.99,
            "reviewed_answer": XSS,
            "reviewer": XSS,
            "reviewed_at": datetime(2026, 12, 1, 13, 0, tzinfo=UTC),
        },
    ]
    batch_id, ids = decided_batch(
        app.sessions,
        rows,
        picture(tmp_path, name="<b onclick=1>name.png"),
        tenant="tests",
        name=XSS,
    )
    browser = TestClient(app.http.app)
    assert sign_in(browser, app.key).status_code == 303
    return app, browser, batch_id, ids


def test_signing_in_sets_a_strict_httponly_cookie_and_out_clears_it(api) -> None:
    app = api()
    browser = TestClient(app.http.app)
    assert browser.get("/ui/batches", follow_redirects=False).headers["location"] == (
        "/ui/signin?next=/ui/batches"
    )
    answer = sign_in(browser, app.key)
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/batches"
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "secure" not in cookie
    assert app.key not in answer.headers["set-cookie"]  # the cookie never holds the key
    page = browser.get("/ui/batches")
    assert page.status_code == 200 and "signed in as" in page.text
    out = browser.post("/ui/signout", data={"csrf": form_token(page.text)}, follow_redirects=False)
    assert out.status_code == 303
    assert browser.get("/ui/batches", follow_redirects=False).status_code == 303


def test_over_https_the_cookie_is_secure(api) -> None:
    app = api()
    browser = TestClient(app.http.app, base_url="https://review.example")
    assert "secure" in sign_in(browser, app.key).headers["set-cookie"].lower()


def test_a_wrong_key_or_a_forged_form_signs_nobody_in(api) -> None:
    app = api()
    browser = TestClient(app.http.app)
    wrong = sign_in(browser, "sk-speceyes-not-a-key")
    assert wrong.status_code == 401 and "unknown or revoked" in wrong.text
    forged = browser.post(
        "/ui/signin", data={"key": app.key, "csrf": "0" * 64}, follow_redirects=False
    )
    assert forged.status_code == 403 and "speceyes_session" not in forged.headers.get(
        "set-cookie", ""
    )


def test_only_a_page_of_ours_is_a_place_to_go_after_signing_in(api) -> None:
    app = api()
    for target in ("https://evil.example/", "//evil.example", "/ui\\..\\x"):
        answer = sign_in(TestClient(app.http.app), app.key, next=target)
        assert answer.headers["location"] == "/ui/batches", target


def test_a_revoked_key_is_signed_out_at_once(site) -> None:
    app, browser, batch_id, _ = site
    assert browser.get(f"/ui/batches/{batch_id}").status_code == 200
    with app.sessions.begin() as session:
        revoke_key(session, "tests")
    assert browser.get(f"/ui/batches/{batch_id}", follow_redirects=False).status_code == 303


def test_every_page_has_the_security_headers(site) -> None:
    _, browser, batch_id, ids = site
    for path in ("/ui/signin", "/ui/batches", f"/ui/batches/{batch_id}", f"/ui/jobs/{ids[1]}"):
        answer = browser.get(path)
        assert answer.status_code == 200, path
        policy = answer.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["x-frame-options"] == "DENY"
        assert "<script>" not in answer.text.replace('<script src="/ui/static/ui.js" defer>', "")


def test_what_users_and_models_wrote_is_escaped_on_every_page(site) -> None:
    _, browser, batch_id, ids = site
    pages = [
        "/ui/batches",
        f"/ui/batches/{batch_id}",
        f"/ui/batches/{batch_id}/results?q=question",
        f"/ui/batches/{batch_id}/review",
        f"/ui/jobs/{ids[1]}",
        f"/ui/jobs/{ids[2]}",
    ]
    for path in pages:
        text = browser.get(path).text
        assert XSS not in text and "<img src=x" not in text, path
        assert str(escape(XSS)) in text, path  # shown, as text
    assert "<b onclick" not in browser.get(f"/ui/jobs/{ids[1]}").text


@pytest.mark.parametrize("token", ["forged", "", None], ids=["forged", "empty", "absent"])
def test_a_form_without_the_sessions_token_changes_nothing(site, token) -> None:
    app, browser, _, ids = site
    form = {"answer": "no"} | ({} if token is None else {"csrf": token})
    answer = browser.post(f"/ui/jobs/{ids[0]}/review", data=form)
    assert answer.status_code == 403
    assert app.http.get(f"/v1/jobs/{ids[0]}").json()["reviewed_answer"] is None
    signout = {} if token is None else {"csrf": token}
    assert browser.post("/ui/signout", data=signout).status_code == 403
    assert browser.get("/ui/batches", follow_redirects=False).status_code == 200  # still in


@pytest.mark.parametrize("token", ["forged", "", None], ids=["forged", "empty", "absent"])
def test_the_cancel_button_needs_the_sessions_token(site, token) -> None:
    app, browser, _, _ = site
    image = base64.b64encode(png(colour=(3, 141, 59))).decode()
    batch = app.http.post("/v1/batches", json={"jobs": [{"question": "Q?", "image_base64": image}]})
    batch_id = batch.json()["id"]
    form = {} if token is None else {"csrf": token}
    assert browser.post(f"/ui/batches/{batch_id}/cancel", data=form).status_code == 403
    assert app.http.get(f"/v1/batches/{batch_id}").json()["by_status"] == {"queued": 1}
    page = browser.get(f"/ui/batches/{batch_id}").text
    sent = browser.post(
        f"/ui/batches/{batch_id}/cancel", data={"csrf": form_token(page)}, follow_redirects=False
    )
    assert sent.status_code == 303
    assert app.http.get(f"/v1/batches/{batch_id}").json()["by_status"] == {"cancelled": 1}
    assert "Resume batch" in browser.get(f"/ui/batches/{batch_id}").text


def test_a_review_on_the_page_is_what_v1_and_the_export_read(site) -> None:
    app, browser, batch_id, ids = site
    token = form_token(browser.get(f"/ui/jobs/{ids[1]}").text)
    answer = browser.post(
        f"/ui/jobs/{ids[1]}/review",
        data={"pick": "B", "answer": "ignored: the pick wins", "csrf": token},
        follow_redirects=False,
    )
    assert answer.status_code == 303
    view = app.http.get(f"/v1/jobs/{ids[1]}").json()
    assert (view["reviewed_answer"], view["reviewer"]) == ("plain", "tests")  # B's text
    export = browser.get(f"/ui/batches/{batch_id}/export.jsonl").text
    assert '"reviewed_answer": "plain"' in export and '"final_answer": "plain"' in export


def test_another_tenants_batch_job_and_image_are_not_found(site) -> None:
    app, _, batch_id, ids = site
    with app.sessions.begin() as session:
        other_key = create_key(session, "other", tenant="elsewhere")[1]
    other = TestClient(app.http.app)
    sign_in(other, other_key)
    for path in (
        f"/ui/batches/{batch_id}",
        f"/ui/batches/{batch_id}/results",
        f"/ui/batches/{batch_id}/review",
        f"/ui/batches/{batch_id}/export.jsonl",
        f"/ui/jobs/{ids[0]}",
        f"/ui/jobs/{ids[0]}/image",
        f"/ui/jobs/{ids[1]}/steps/0/crop",
        f"/ui/jobs/{ids[1]}/steps/0/crop?small=true",
        "/ui/jobs/not-an-id",  # (no id at all: the same answer)
        "/ui/batches/not-an-id",
    ):
        answer = other.get(path)
        assert answer.status_code == 404, path
    assert batch_id not in other.get("/ui/batches").text


def test_a_thyme_step_shows_its_code_output_and_only_our_thumbnails(api, tmp_path) -> None:
    app = api()
    png = "data:image/png;base64,iVBORw0KGgo="
    step = {
        "index": 0,
        "text": "<code>crop</code>",
        "finish_reason": "stop",
        "new_tokens": 9,
        "generate_seconds": 0.3,
        "code": f"print('{XSS}')",
        "code_output": f"printed {XSS}",
        "images": [
            {"thumbnail": png, "width": 8, "height": 8},
            {"thumbnail": "javascript:alert(1)"},  # not one we encoded: left out
            {"thumbnail": "data:text/html;base64,PHNjcmlwdD4="},
        ],
        "sandbox_stop": "cpu_time",
    }
    trajectory = {"steps": [step], "answer": None, "error_code": "step_limit", "error": "gave up"}
    rows = [{"status": "failed", "error_code": "step_limit", "trajectory": trajectory}]
    _, (job_id,) = decided_batch(app.sessions, rows, picture(tmp_path), tenant="tests")
    browser = TestClient(app.http.app)
    sign_in(browser, app.key)
    text = browser.get(f"/ui/jobs/{job_id}").text
    assert str(escape(f"print('{XSS}')")) in text and str(escape(f"printed {XSS}")) in text
    assert text.count(f'src="{png}"') == 1
    assert "javascript:" not in text and "data:text/html" not in text
    assert "cpu_time" in text and "gave up" in text


def test_a_form_sent_after_the_session_ended_goes_back_to_its_page(api) -> None:
    app = api()
    browser = TestClient(app.http.app)
    answer = browser.post(
        "/ui/jobs/0123/review",
        data={"answer": "x"},
        headers={"Referer": "http://testserver/ui/batches/abc/review"},
        follow_redirects=False,
    )
    assert answer.headers["location"] == "/ui/signin?next=/ui/batches/abc/review"
    scripted = browser.post(
        "/ui/jobs/0123/review", data={"answer": "x"}, headers={"Accept": "application/json"}
    )  # the review queue's script: the API's shape, which it shows
    assert scripted.status_code == 401 and scripted.json()["error"] == "signin_required"


@pytest.mark.parametrize(
    "cookie", [b"abc.\xc3\xa9", b"eyJrIjogbnVsbH0.", b"x" * 5000, b"..", b"e30.00"]
)
def test_a_forged_or_garbled_cookie_or_token_is_refused_not_a_crash(site, cookie: bytes) -> None:
    app, browser, _, _ = site
    stranger = TestClient(app.http.app)
    headers = {"cookie": b"speceyes_session=" + cookie}  # bytes: as a browser may send
    assert stranger.get("/ui/batches", headers=headers, follow_redirects=False).status_code == 303
    answer = browser.post("/ui/signout", data={"csrf": "t\u00e9st"}, follow_redirects=False)
    assert answer.status_code == 403


def test_the_pages_share_the_keys_rate_limit(api, tmp_path) -> None:
    app = api(api_rate_per_s=0.5, api_rate_burst=3)
    browser = TestClient(app.http.app)
    sign_in(browser, app.key)
    statuses = [browser.get("/ui/batches").status_code for _ in range(6)]
    assert statuses[:2] == [200, 200] and statuses[-1] == 429


@pytest.mark.parametrize(
    "fields",
    [
        {"trajectory": {"steps": "not a list"}},
        {"trajectory": ["a", "list"]},
        {"trajectory": {"steps": [1, "two", {"text": 3, "generate_seconds": "soon"}]}},
        {"trajectory": {"steps": [{"box_original": ["1", 2, 3, 4], "images": 7}]}},
        {"gate": ["odd"], "confidence": 0.5, "token_scores": ["x", None, True]},
        {"gate": {"threshold": "high"}, "confidence": 0.5, "token_scores": {"a": 1}},
        {"zoom_steps": {"not": "a list"}},
        {"zoom_steps": [1, {"box_original": [1, 2], "text": None}]},
    ],
)
def test_a_job_page_survives_a_trace_of_any_shape(api, tmp_path, fields: dict) -> None:
    app = api()
    rows = [{"answered_by": "large", "final_answer": "x", **fields}]
    _, (job_id,) = decided_batch(app.sessions, rows, picture(tmp_path), tenant="tests")
    browser = TestClient(app.http.app)
    sign_in(browser, app.key)
    assert browser.get(f"/ui/jobs/{job_id}").status_code == 200
    assert browser.get(f"/ui/jobs/{job_id}/steps/0/crop").status_code == 404


def test_a_zoom_box_given_corner_last_is_drawn_as_the_crop_is_cut(api, tmp_path) -> None:
    app = api()
    trajectory = zoom_trajectory("A")
    trajectory["steps"][0]["box_original"] = [40, 30, 8, 6]  # the corners swapped
    rows = [{"answered_by": "large", "final_answer": "A", "trajectory": trajectory}]
    _, (job_id,) = decided_batch(app.sessions, rows, picture(tmp_path), tenant="tests")
    browser = TestClient(app.http.app)
    sign_in(browser, app.key)
    assert 'x="8" y="6" width="32" height="24"' in browser.get(f"/ui/jobs/{job_id}").text


def test_the_small_models_zooms_are_drawn_with_their_crops_and_its_text_escaped(
    api, tmp_path
) -> None:
    """Speculation in depth: the small model's steps before the gate, above the agent's,
    each zoom with its box and its crop (``?small=true``); none where it took none."""
    app = api(image_roots=[tmp_path])
    small = zoom_trajectory("B", text=f"small {XSS}")["steps"]
    small[0]["box_original"] = [0, 0, 20, 10]
    rows = [
        {"answered_by": "small", "final_answer": "B", "confidence": 0.99, "zoom_steps": small},
        {"answered_by": "large", "final_answer": "A", "trajectory": zoom_trajectory("A")},
    ]
    _, (zoomed, agent) = decided_batch(app.sessions, rows, picture(tmp_path), tenant="tests")
    browser = TestClient(app.http.app)
    sign_in(browser, app.key)
    page = browser.get(f"/ui/jobs/{zoomed}").text
    assert "The small model's zooms before the gate (2 steps)" in page
    assert f"small {escape(XSS)}" in page and XSS not in page
    assert 'x="0" y="0" width="20" height="10"' in page
    assert f"/ui/jobs/{zoomed}/steps/0/crop?small=true" in page and "Trajectory" not in page
    crop = browser.get(f"/ui/jobs/{zoomed}/steps/0/crop?small=true")
    assert crop.status_code == 200 and crop.headers["content-type"].startswith("image/")
    assert browser.get(f"/ui/jobs/{zoomed}/steps/0/crop").status_code == 404  # no agent's
    assert browser.get(f"/ui/jobs/{zoomed}/steps/1/crop?small=true").status_code == 404
    other = browser.get(f"/ui/jobs/{agent}").text
    assert "zooms before the gate" not in other and "Trajectory (2 steps)" in other
    served = app.http.get(f"/v1/jobs/{zoomed}/steps/0/crop?small=true")
    assert served.status_code == 200
    assert app.http.get(f"/v1/jobs/{zoomed}/trace").json()["zoom_steps"][0]["box_original"] == [
        0,
        0,
        20,
        10,
    ]


def test_a_job_page_survives_an_image_with_broken_exif(api) -> None:
    app = api()
    path = app.root / "exif.png"
    Image.new("RGB", (40, 30), (1, 2, 3)).save(path, exif=b"garbage!garbage!")
    rows = [{"status": "failed", "error_code": "image_error"}]
    _, (job_id,) = decided_batch(app.sessions, rows, path, tenant="tests")
    browser = TestClient(app.http.app)
    sign_in(browser, app.key)
    assert browser.get(f"/ui/jobs/{job_id}").status_code == 200


def test_jobs_sent_one_by_one_are_found_on_the_jobs_page_their_tenants_only(api) -> None:
    app = api()
    mine = upload(app, png(colour=(1, 2, 3)), question="one of mine?").json()["id"]
    other = app.key_for("other")
    theirs = app.http.post(
        "/v1/jobs",
        data={"question": "theirs?"},
        files={"image": ("b.png", png(colour=(4, 5, 6)))},
        headers=other,
    ).json()["id"]
    browser = TestClient(app.http.app)
    assert sign_in(browser, app.key, next="/ui/jobs").status_code == 303
    listed = browser.get("/ui/jobs")
    assert listed.status_code == 200
    assert f'href="/ui/jobs/{mine}"' in listed.text and theirs not in listed.text
    assert "one of mine?" in listed.text
    assert mine not in browser.get("/ui/jobs", params={"status": "failed"}).text
    assert browser.get("/ui/jobs", params={"status": "sleeping"}).status_code == 422
    assert browser.get("/ui/jobs", params={"after": "not-a-cursor"}).status_code == 422
    job_page = browser.get(f"/ui/jobs/{mine}")  # where its answer is reviewed
    assert job_page.status_code == 200 and f'action="/ui/jobs/{mine}/review"' in job_page.text
    assert browser.get(f"/ui/jobs/{theirs}").status_code == 404


def test_a_row_that_failed_for_its_text_is_not_labelled_as_missing_its_image(api, tmp_path) -> None:
    app = api()
    rows = [
        {
            "status": "failed",
            "image_path": None,
            "error_code": "question_empty",
            "error_message": "the question is empty",
            "question": "",
        },
        {"status": "failed", "error_code": "image_missing", "error_message": "gone"},
    ]
    batch_id, _ = decided_batch(app.sessions, rows, picture(tmp_path), tenant="tests")
    browser = TestClient(app.http.app)
    assert sign_in(browser, app.key).status_code == 303
    grid = browser.get(f"/ui/batches/{batch_id}").text
    assert "not run: question_empty" in grid and "no image: question_empty" not in grid
    assert "no image: image_missing" in grid


def test_a_large_batchs_page_answers_before_its_overview_is_made(site, monkeypatch) -> None:
    """Over SOON_AFTER_JOBS jobs (lowered here to 2), the page does not score every
    row before it answers: it says the overview is being made, a thread of the server
    makes it, and the page shows it once made (18 s at a million jobs otherwise)."""
    from common.store import overview
    from tests.helpers.waiting import wait_until

    monkeypatch.setattr(overview, "SOON_AFTER_JOBS", 2)
    _, browser, batch_id, _ = site
    first = browser.get(f"/ui/batches/{batch_id}")
    assert first.status_code == 200 and "being worked out over 3 jobs" in first.text
    assert "<h2>Time per stage</h2>" not in first.text and "Results" in first.text
    wait_until(
        lambda: "<h2>Time per stage</h2>" in browser.get(f"/ui/batches/{batch_id}").text,
        deadline_s=30,
    )
    assert "being worked out" not in browser.get(f"/ui/batches/{batch_id}").text
