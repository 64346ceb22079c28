"""The review pages in a real browser (Chromium through Playwright) against a served app
whose embedded runner works batches with scripted models: sign in, watch a batch run to
its end, filter, see a zoom, correct an answer with the keyboard, export it, hostile text
shown as text, and another tenant refused."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from playwright.sync_api import Page, expect
from sqlalchemy import select

from api.app import create_app
from common.backends import Models
from common.backends.scripted import JobScript, ScriptedModel, SimulatedCost
from common.config import Settings
from common.pipeline.runner import EmbeddedRunner
from common.store import overview
from common.store.db import open_store
from common.store.keys import create_key
from common.store.tables import Job
from tests.helpers.images import write_images
from tests.helpers.live_app import live_app
from tests.helpers.reviewing import decided_batch
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.browser

# what a check waits for at most: a page on a busy machine (two lanes of tests on two
# cores) may take seconds to answer; a check passes as soon as it holds, so a quick page
# costs nothing more
expect.set_options(timeout=20_000)

ZOOM = (
    '<think>{think}</think><tool_call>{{"name": "image_zoom_in_tool", "arguments": '
    '{{"bbox_2d": [4, 4, 40, 30], "label": "thing"}}}}</tool_call>'
)
# What a hostile user or model writes: each would run script if a page took it as HTML.
PAYLOAD = '<img src=x onerror="window.pwned=1"><script>window.pwned=1</script>'


@dataclass
class Live:
    base: str
    key: str  # tenant "team"
    other_key: str  # tenant "elsewhere"
    http: httpx.Client  # the API, as the "team" key
    reviewer: httpx.Client  # the API, as a "team" key whose name is hostile
    images: list[Path]
    sessions: Any  # the store, for rows a test lays down itself

    def submit(self, questions: list[str], name: str, options: list[str] | None = None) -> str:
        jobs = [
            {"image_path": str(self.images[i % len(self.images)]), "question": q}
            | ({"options": options} if options else {})
            for i, q in enumerate(questions)
        ]
        answer = self.http.post("/v1/batches", json={"name": name, "jobs": jobs})
        assert answer.status_code == 202, answer.text
        return str(answer.json()["id"])

    def finished(self, batch_id: str) -> dict:
        return wait_until(
            lambda: (b := self.http.get(f"/v1/batches/{batch_id}").json())["progress"] == 1.0 and b,
            deadline_s=120,
            what=f"batch {batch_id} to finish",
        )


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A served app over SQLite; its scripted models act on the question's tag: [agent]
    zooms then answers B, [small] is answered A by the small model, [hostile] has the
    agent write the payload. Each job costs a little time, so a batch is seen running."""
    root = tmp_path_factory.mktemp("live")
    images = write_images(root / "images", 3, size=(64, 48))
    url = f"sqlite:///{root / 'store.db'}"
    settings = Settings(
        backend="scripted",
        database_url=url,
        upload_dir=root / "uploads",
        image_roots=[root / "images"],
        fast_batch_size=4,
        gate_threshold=0.9,
        audit_rate=0.0,
        speculation_depth=1,  # (a job the small model answers at once takes one turn)
        depth_scope="tool_free",  # ("[agent]" jobs go to the agent, as the screen says)
    )
    sessions = open_store(url)

    def script(job_id: str) -> JobScript:
        with sessions() as session:
            question = session.scalar(select(Job.question).where(Job.id == job_id)) or ""
        if "[agent]" in question:
            return JobScript(
                needs_tools=True, agent_steps=(ZOOM.format(think="zoom"), "<answer>B</answer>")
            )
        if "[hostile]" in question:
            return JobScript(
                needs_tools=True,
                agent_steps=(ZOOM.format(think=PAYLOAD), f"<answer>{PAYLOAD}</answer>"),
            )
        if "[zoom-small]" in question:  # the small model zooms once, then answers C
            steps = (ZOOM.format(think="small zoom"), "<answer>C</answer>")
            return JobScript(zoom_steps=steps, confidence=0.95)
        if "[long]" in question:  # looks and looks, never answers: a step_limit failure
            return JobScript(needs_tools=True, agent_steps=("<think>still looking</think>",))
        return JobScript(answer="A", confidence=0.95)

    costs = {"screen": SimulatedCost(0.05, 0.05), "generate": SimulatedCost(0.2)}
    model = ScriptedModel(default=script, costs=costs)
    runner = EmbeddedRunner(sessions, Models(model, model), settings)
    with sessions.begin() as session:
        key = create_key(session, "reviewer-ann", tenant="team")[1]
        other = create_key(session, "stranger", tenant="elsewhere")[1]
        hostile = create_key(session, PAYLOAD, tenant="team")[1]
    app = create_app(settings, sessions=sessions, dispatcher=runner)
    with (
        live_app(app) as base,
        httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http,
        httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {hostile}"}, timeout=30
        ) as reviewer,
    ):
        yield Live(base, key, other, http, reviewer, images, sessions)
    sessions.close()


def sign_in(page: Page, live: Live, key: str | None = None, then: str = "/ui/batches") -> None:
    page.goto(f"{live.base}{then}")  # not signed in: sent to the sign-in page, and back
    expect(page.locator("h1")).to_have_text("Sign in")
    page.fill("input[name=key]", key or live.key)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live.base}{then.split('?')[0]}*")


def test_sign_in_and_watch_a_batch_run_to_its_end(page: Page, page_errors, live: Live) -> None:
    questions = [f"{'[agent] ' if i % 3 == 0 else '[small] '}what is it? #{i}" for i in range(12)]
    batch_id = live.submit(questions, name="watched")
    sign_in(page, live, then=f"/ui/batches/{batch_id}")
    page.evaluate("window.sameDocument = true")  # gone if the page reloads
    expect(page.locator("#progress .badge.running")).to_be_visible()
    expect(page.locator("#progress .badge.done")).to_be_visible(timeout=60_000)
    assert page.evaluate("window.sameDocument") is True  # updated in place
    expect(page.locator("#progress .finished")).to_have_text("12")
    assert live.finished(batch_id)["by_status"] == {"done": 12}
    assert page_errors == []


def test_a_large_batchs_page_answers_at_once_and_shows_its_overview_once_made(
    page: Page, page_errors, live: Live, monkeypatch
) -> None:
    """Over ``SOON_AFTER_JOBS`` jobs (lowered here to 2) a thread makes the overview
    (held here until the page has been seen): the page says so, then shows it."""
    monkeypatch.setattr(overview, "SOON_AFTER_JOBS", 2)
    seen, make = threading.Event(), overview._make
    monkeypatch.setattr(overview, "_make", lambda *a: (seen.wait(30), make(*a)))
    batch_id = live.submit([f"[small] what is it? #{i}" for i in range(3)], name="large")
    live.finished(batch_id)
    sign_in(page, live, then=f"/ui/batches/{batch_id}")
    expect(page.locator(".overview-pending")).to_contain_text("over 3 jobs")
    expect(page.locator(".accuracy")).to_have_count(0)
    seen.set()
    wait_until(lambda: batch_id not in overview._MAKING, deadline_s=30, what="the overview made")
    page.reload()
    expect(page.locator(".stages")).to_contain_text("Time per stage")
    expect(page.locator(".usage")).to_contain_text("Model time, and what the funnel saved")
    expect(page.locator(".overview-pending")).to_have_count(0)
    assert page_errors == []


def test_filter_the_grid(page: Page, page_errors, live: Live) -> None:
    questions = [f"{'[agent]' if i % 2 else '[small]'} which one? #{i}" for i in range(8)]
    batch_id = live.submit(questions, name="filtered")
    live.finished(batch_id)
    sign_in(page, live, then=f"/ui/batches/{batch_id}")
    page.select_option("select[name=who]", "small")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**/results?**who=small**")
    rows = page.locator("table.grid tbody tr.row")
    expect(rows).to_have_count(4)
    for text in rows.locator("td:nth-child(5)").all_inner_texts():  # (who answered)
        assert text == "small model"
    page.fill("input[name=q]", "#3")
    page.select_option("select[name=who]", "")
    page.click("form.filters button[type=submit]")
    expect(rows).to_have_count(1)
    expect(rows.locator("td.question a")).to_have_text("[agent] which one? #3")
    assert page_errors == []


def open_its_job(page: Page, live: Live, question: str) -> str:
    """Submit ``question`` alone, wait for its end, open its job's page from the grid;
    the job's id."""
    batch_id = live.submit([question], name=question)
    live.finished(batch_id)
    sign_in(page, live, then=f"/ui/batches/{batch_id}")
    page.click("table.grid td.question a")
    return page.url.split("/ui/jobs/")[1].split("?")[0]


def test_open_a_job_and_see_its_zoom_box_drawn(page: Page, page_errors, live: Live) -> None:
    job_id = open_its_job(page, live, "[agent] where is it?")
    box = page.locator("section.picture rect.zoom-box")
    expect(box).to_be_visible()
    drawn = box.bounding_box()
    assert drawn is not None and drawn["width"] > 10 and drawn["height"] > 10
    crop = page.locator("img.crop")
    expect(crop).to_be_visible()
    step = live.http.get(f"/v1/jobs/{job_id}/trace").json()["trajectory"]["steps"][0]
    x1, y1, x2, y2 = step["box_original"]  # the box on the original image, as drawn
    assert [float(box.get_attribute(side) or 0) for side in ("x", "y", "width", "height")] == [
        x1,
        y1,
        x2 - x1,
        y2 - y1,
    ]
    assert page.evaluate("img => img.naturalWidth", crop.element_handle()) == x2 - x1
    page.locator("[data-zoomable]").click()  # zooms in place
    expect(page.locator("[data-zoomable]")).to_have_class("zoomable zoomed")
    assert page_errors == []


def test_a_specreason_job_shows_who_wrote_each_step_its_score_and_the_rejected_proposal(
    page: Page, page_errors, live: Live
) -> None:
    kept = {"index": 0, "text": "<think>look left</think>", "finish_reason": "stop"}
    corrected = {"index": 1, "text": "<answer>B</answer>", "finish_reason": "stop"}
    steps = [
        kept | {"proposer": "small", "score": 8, "accepted": True},
        corrected
        | {"proposer": "large", "score": 3, "accepted": False, "proposal": "<answer>C</answer>"},
    ]
    _, (job_id,) = decided_batch(
        live.sessions,
        [{"answered_by": "large", "final_answer": "B", "trajectory": {"steps": steps}}],
        live.images[0],
        tenant="team",
        name="specreason",
    )
    sign_in(page, live, then=f"/ui/jobs/{job_id}")
    articles = page.locator("section.trajectory article.step")
    expect(articles).to_have_count(2)
    expect(articles.nth(0).locator("p.specreason")).to_have_text(
        "Proposed by the small model; the large model scored it 8: kept."
    )
    expect(articles.nth(1).locator("p.specreason")).to_have_text(
        "The small model's proposal scored 3: rejected; the large model wrote this step."
    )
    expect(articles.nth(1).locator("pre.proposal")).to_have_text("<answer>C</answer>")
    expect(articles.nth(0).locator("pre.proposal")).to_have_count(0)
    assert page_errors == []


def test_see_the_small_models_zoom_before_the_gate(page: Page, page_errors, live: Live) -> None:
    job_id = open_its_job(page, live, "[zoom-small] what is it?")
    section = page.locator("section.speculation")
    expect(section.locator("h2")).to_have_text("The small model's zooms before the gate (2 steps)")
    crop = section.locator("img.crop")
    expect(crop).to_be_visible()
    zoomed = live.http.get(f"/v1/jobs/{job_id}/trace").json()["zoom_steps"][0]
    x1, _, x2, _ = zoomed["box_original"]
    page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=crop.element_handle())
    assert page.evaluate("img => img.naturalWidth", crop.element_handle()) == x2 - x1
    assert page.locator("section.trajectory").count() == 0  # the gate accepted: no agent
    assert page_errors == []


def test_correct_an_answer_with_the_keyboard_and_find_it_in_the_export(
    page: Page, page_errors, live: Live
) -> None:
    batch_id = live.submit(
        ["[small] which animal?", "[small] which animal, again?"],
        name="reviewed",
        options=["cat", "dog", "cow"],
    )
    live.finished(batch_id)
    sign_in(page, live, then=f"/ui/batches/{batch_id}/review")
    entries = page.locator(".queue .entry")
    expect(entries).to_have_count(2)
    first = entries.nth(0)
    expect(first).to_be_visible()
    page.keyboard.press("j")  # next, and back
    expect(entries.nth(1)).to_be_visible()
    page.keyboard.press("k")
    expect(first).to_be_visible()
    page.keyboard.press("2")  # option B
    expect(first.locator("input.answer-text")).to_have_value("B")
    # Enter twice at once (one task, as a double press lands while the first is in
    # flight): the second is not a second review, nor a review of the next entry
    page.evaluate(
        """() => { for (let i = 0; i < 2; i++)
            document.dispatchEvent(new KeyboardEvent("keydown", {key: "Enter"})); }"""
    )
    expect(first.locator(".outcome")).to_have_text("Reviewed: dog")  # B, kept as its text
    second = entries.nth(1)
    expect(second).to_be_visible()  # on to the next, and not past it
    expect(second.locator(".outcome")).to_have_count(0)
    page.keyboard.press("1")  # A, then typed text: the text is the answer
    page.keyboard.press("e")
    page.keyboard.type("cow")
    page.keyboard.press("Enter")
    expect(second.locator(".outcome")).to_have_text("Reviewed: cow")
    expect(page.locator("[data-queue-finished]")).to_be_visible()  # the queue's end
    job_id = first.get_attribute("data-job")

    page.goto(f"{live.base}/ui/batches/{batch_id}")
    with page.expect_download() as download:
        page.click("a[href$='export.jsonl']")
    rows = [json.loads(line) for line in Path(download.value.path()).read_text().splitlines()]
    (corrected,) = [row for row in rows if row["job_id"] == job_id]
    assert corrected["answer"] == "A"  # the model's, kept
    assert (corrected["reviewed_answer"], corrected["final_answer"]) == ("dog", "dog")
    assert corrected["reviewer"] == "reviewer-ann" and corrected["reviewed_at"]
    assert page_errors == []


def test_find_a_job_sent_alone_and_correct_it(page: Page, page_errors, live: Live) -> None:
    """A calling service's job (POST /v1/jobs, no batch) is found on the jobs page,
    opened and corrected there, and /v1 then reads the person's answer."""
    job = {"image_path": str(live.images[0]), "question": "[small] sent alone?"}
    job_id = live.http.post("/v1/jobs", json=job | {"options": ["cat", "dog"]}).json()["id"]
    wait_until(
        lambda: live.http.get(f"/v1/jobs/{job_id}").json()["status"] == "done",
        deadline_s=120,
        what="the single job to finish",
    )
    sign_in(page, live, then="/ui/jobs")
    row = page.locator(f"tr[data-job='{job_id}']")
    expect(row).to_contain_text("sent alone?")
    row.locator("a").click()
    page.wait_for_url(f"{live.base}/ui/jobs/{job_id}*")
    page.check("input[name=pick][value=B]")
    page.click("form.review button.confirm")
    expect(page.locator("form.review .reviewed")).to_contain_text("dog")
    read = live.http.get(f"/v1/jobs/{job_id}").json()
    assert (read["reviewed_answer"], read["final_answer"]) == ("dog", "dog")
    assert page_errors == []


def test_jobs_sent_alone_have_a_batchs_grid_filters_and_review_queue(
    page: Page, page_errors, live: Live
) -> None:
    """The jobs a service sent one by one, listed as a batch's rows: filtered in the
    grid, then corrected from their review queue with the keyboard."""
    sent = []
    for number, question in enumerate(("[small] alone, first?", "[agent] alone, second?")):
        job = {"image_path": str(live.images[number]), "question": question, "options": ["a", "b"]}
        sent.append(live.http.post("/v1/jobs", json=job).json()["id"])
    for job_id in sent:
        wait_until(
            lambda job_id=job_id: live.http.get(f"/v1/jobs/{job_id}").json()["status"] == "done",
            deadline_s=120,
            what="the single jobs to finish",
        )
    sign_in(page, live, then="/ui/jobs")
    page.click("p.alone a[href='/ui/alone/results']")
    rows = page.locator("table.grid tbody tr.row")
    expect(rows.first).to_be_visible()
    page.fill("input[name=q]", "alone,")  # (this test's, among the module's single jobs)
    page.click("form.filters button[type=submit]")
    expect(rows).to_have_count(2)
    page.select_option("select[name=who]", "large")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**/ui/alone/results?**who=large**")
    expect(rows).to_have_count(1)
    expect(rows.locator("td.question a")).to_have_text("[agent] alone, second?")
    expect(rows.locator("td.row-id a")).to_have_text(sent[1])  # (a job alone: its id)

    page.goto(f"{live.base}/ui/alone/review")
    entries = page.locator(".queue .entry")
    expect(entries).to_have_count(1)  # the gate's answer, the one worth a look
    expect(entries.nth(0)).to_have_attribute("data-job", sent[0])
    page.keyboard.press("2")
    page.keyboard.press("Enter")
    expect(entries.nth(0).locator(".outcome")).to_have_text("Reviewed: b")
    read = live.http.get(f"/v1/jobs/{sent[0]}").json()
    assert (read["reviewed_answer"], read["final_answer"]) == ("b", "b")
    assert page_errors == []


def test_cancel_a_running_batch_from_its_page_then_resume_it(
    page: Page, page_errors, live: Live
) -> None:
    """The batch page's Cancel button (a form with the session's CSRF token) stops what
    has not finished; Resume takes the cancelled jobs up again."""
    batch_id = live.submit([f"[long] look {i}" for i in range(6)], name="to cancel")
    sign_in(page, live, then=f"/ui/batches/{batch_id}")
    page.click("form.control button:has-text('Cancel batch')")
    page.wait_for_url(f"{live.base}/ui/batches/{batch_id}")
    batch = live.http.get(f"/v1/batches/{batch_id}").json()
    assert batch["cancelled"].get("cancelled", 0) >= 1, batch
    assert not {"queued", "deferred"} & set(batch["by_status"]), batch  # none waits now
    live.finished(batch_id)  # the trajectories that ran stop at their next step
    page.reload()
    expect(page.locator("#progress .cancelled")).to_contain_text("cancelled")
    page.click("form.control button:has-text('Resume batch')")
    page.wait_for_url(f"{live.base}/ui/batches/{batch_id}")
    resumed = live.http.get(f"/v1/batches/{batch_id}").json()
    assert "cancelled" not in resumed["by_status"], resumed  # each waits or runs again
    assert live.http.post(f"/v1/batches/{batch_id}/cancel").status_code == 200  # (no waste)
    live.finished(batch_id)
    assert page_errors == []


def test_hostile_text_shows_as_text_and_no_script_runs(page: Page, page_errors, live: Live) -> None:
    batch_id = live.submit(
        [f"[hostile] {PAYLOAD}?", "[small] reviewed by a hostile name"],
        name=PAYLOAD,
        options=[PAYLOAD, "plain"],
    )
    live.finished(batch_id)
    hostile, reviewed = (
        r["job_id"] for r in live.http.get(f"/v1/batches/{batch_id}/rows").json()["data"]
    )
    # a reviewer whose key's name, and whose corrected answer, are the payload
    review = live.reviewer.post(f"/v1/jobs/{reviewed}/review", json={"answer": PAYLOAD})
    assert review.status_code == 200, review.text
    sign_in(page, live)
    for path in (
        "/ui/batches",
        f"/ui/batches/{batch_id}",
        f"/ui/batches/{batch_id}/results",
        f"/ui/batches/{batch_id}/review",
        f"/ui/jobs/{reviewed}",
        f"/ui/jobs/{hostile}",
    ):
        page.goto(f"{live.base}{path}")
        assert PAYLOAD in page.locator("main").inner_text(), path  # shown, as text
        assert page.evaluate("window.pwned") is None, path
    # the job page shows the payload as the question, an option, the model's text and answer
    assert page.locator("main").inner_text().count(PAYLOAD) >= 4
    page.goto(f"{live.base}/ui/jobs/{reviewed}")  # the reviewer's name and answer, as text
    assert page.locator("main").inner_text().count(PAYLOAD) >= 3  # (+ an option)
    assert page.evaluate("window.pwned") is None
    assert page_errors == []  # not even a script blocked by the policy


def test_another_tenant_gets_404_for_the_batch_the_job_and_the_image(
    page: Page, live: Live
) -> None:
    batch_id = live.submit(["[small] whose is it?"], name="private")
    live.finished(batch_id)
    job_id = live.http.get(f"/v1/batches/{batch_id}/rows").json()["data"][0]["job_id"]
    sign_in(page, live, key=live.other_key)
    for path in (f"/ui/batches/{batch_id}", f"/ui/jobs/{job_id}", f"/ui/jobs/{job_id}/image"):
        response = page.goto(f"{live.base}{path}")
        assert response is not None and response.status == 404, path
    page.goto(f"{live.base}/ui/batches")
    expect(page.locator("main")).not_to_contain_text("private")


def test_the_api_docs_render_with_nothing_but_this_server(page: Page, live: Live) -> None:
    """/docs offline: Swagger UI's script and styles come from the server, not a CDN
    (every other request is refused here, and there is none)."""
    elsewhere: list[str] = []

    def only_this_server(route) -> None:
        if route.request.url.startswith(live.base):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    page.route("**/*", only_this_server)
    page.goto(f"{live.base}/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("SpecEyes")
    expect(page.locator(".opblock-summary-path", has_text="/v1/jobs").first).to_be_visible()
    assert elsewhere == []


def test_failed_rows_show_why_not_a_broken_image_and_every_row_its_id_and_link(
    page: Page, page_errors, live: Live
) -> None:
    """A row refused for its image's shape, and one with an empty question: placeholders
    with the reason (no 404s), a row-id column that tells rows of one question apart,
    and a link to each job, the empty question's too."""
    thin = live.images[0].with_name("thin.png")
    Image.new("RGB", (3000, 10), (200, 0, 0)).save(thin)
    jobs = [
        {"image_path": str(live.images[0]), "question": "[small] a picture", "id": "good.png"},
        {"image_path": str(thin), "question": "[small] a sliver", "id": "thin.png"},
        {"image_path": str(live.images[1]), "question": "", "id": "blank.png"},
    ]
    answer = live.http.post("/v1/batches", json={"name": "edges", "jobs": jobs})
    assert answer.status_code == 202, answer.text
    batch_id = answer.json()["id"]
    live.finished(batch_id)
    missing: list[str] = []
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    sign_in(page, live, then=f"/ui/batches/{batch_id}/results")
    rows = page.locator("table.grid tbody tr.row")
    expect(rows).to_have_count(3)
    assert rows.locator("td.row-id").all_inner_texts() == ["good.png", "thin.png", "blank.png"]
    placeholders = page.locator("table.grid .thumb.missing")
    expect(placeholders).to_have_count(2)
    assert "image_invalid" in placeholders.nth(0).inner_text()
    assert "aspect ratio" in (placeholders.nth(0).get_attribute("title") or "")
    page.get_by_role("link", name="(no question)").click()
    expect(page.locator("main")).to_contain_text("question_empty")
    assert missing == [] and page_errors == []
