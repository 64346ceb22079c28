"""The HTTP API on the real PostgreSQL: routes, auth, limits, bad input, the client."""

from __future__ import annotations

import base64
import io
import json
import os

import pytest
from fastapi.testclient import TestClient
from PIL import Image
from sqlalchemy import update

from api.app import create_app
from api.client import (
    Conflict,
    InvalidRequest,
    LimitExceeded,
    NotFound,
    SpecEyesClient,
    Timeout,
    Unauthorized,
)
from cli.compose import make_dispatcher
from common.backends.scripted import JobScript
from common.config import Settings
from common.store.db import open_store
from common.store.keys import create_key, revoke_key
from common.store.tables import Batch, Job
from lab.ports import reserved_port
from tests.helpers.api import upload
from tests.helpers.images import png
from tests.helpers.waiting import wait_until
from tests.helpers.workers import WorkerProcess
from workers.queues import CeleryDispatcher


def test_every_v1_route_needs_a_live_key(api):
    server = api()
    anonymous = TestClient(server.http.app)
    for method, path in [
        ("post", "/v1/jobs"),
        ("get", "/v1/jobs/" + "0" * 32),
        ("post", "/v1/batches"),
        ("get", "/v1/batches/" + "0" * 32),
    ]:
        response = getattr(anonymous, method)(path)
        assert response.status_code == 401 and response.json()["error"] == "unauthorized"
    wrong = anonymous.get("/v1/jobs/" + "0" * 32, headers={"X-API-Key": "sk-speceyes-nope"})
    assert wrong.status_code == 401
    assert anonymous.get("/healthz").status_code == 200  # probes need no key
    with server.sessions.begin() as session:
        revoke_key(session, "tests")
    assert server.http.get("/v1/jobs/" + "0" * 32).status_code == 401


def test_a_job_is_created_once_per_idempotency_key_and_enqueued_after_commit(api):
    server = api()
    first = upload(server, png(), idempotency_key="k1")
    assert first.status_code == 202
    body = first.json()
    assert body["status"] == "queued" and body["created"] is True
    assert server.enqueued == [body["id"]]

    again = upload(server, png(), idempotency_key="k1")
    assert again.status_code == 202 and again.json() == {**body, "created": False}
    # a retry sends a job that still waits again (its first message may be lost)
    assert server.enqueued == [body["id"]] * 2 and server.jobs() == 1

    other = upload(server, png(), question="Another question?", idempotency_key="k1")
    assert other.status_code == 409 and other.json()["error"] == "idempotency_conflict"

    view = server.http.get(f"/v1/jobs/{body['id']}").json()
    assert view["status"] == "queued" and view["question"] == "What colour?"
    assert view["timings"]["created_at"] and view["error"] is None


def test_json_jobs_take_base64_or_a_path_inside_the_roots_only(api, tmp_path):
    server = api()
    data = png()
    ok = server.http.post(
        "/v1/jobs", json={"question": "Q?", "image_base64": base64.b64encode(data).decode()}
    )
    assert ok.status_code == 202
    (server.root / "a.png").write_bytes(data)
    inside = server.http.post(
        "/v1/jobs", json={"question": "Q?", "image_path": str(server.root / "a.png")}
    )
    assert inside.status_code == 202
    outside_file = tmp_path / "secret.png"
    outside_file.write_bytes(data)
    (server.root / "link.png").symlink_to(outside_file)
    cases = {
        str(outside_file): (403, "path_outside_roots"),
        str(server.root / "link.png"): (403, "path_outside_roots"),  # a symlink out
        str(server.root / ".." / "secret.png"): (422, "path_traversal"),
        str(server.root / "missing.png"): (404, "image_missing"),
        # the command line's locators and URLs: never fetched for a client
        "s3://bucket/a.png": (422, "url_fetching_disabled"),
        "https://example.org/a.png": (422, "url_fetching_disabled"),
        '{"tar": "/etc/passwd", "member": "x.png", "offset": 0, "size": 10}': (
            422,
            "url_fetching_disabled",
        ),
    }
    for path, (status, error) in cases.items():
        response = server.http.post("/v1/jobs", json={"question": "Q?", "image_path": path})
        assert (response.status_code, response.json()["error"]) == (status, error), path
    url = server.http.post("/v1/jobs", json={"question": "Q?", "image_url": "http://x/a.png"})
    assert url.status_code == 422 and url.json()["error"] == "url_fetching_disabled"
    closed = api(image_roots=[])  # no roots configured: no server paths at all
    response = closed.http.post("/v1/jobs", json={"question": "Q?", "image_path": "/etc/x"})
    assert response.status_code == 403 and response.json()["error"] == "server_paths_disabled"
    assert server.jobs() == 2


def test_each_limit_answers_4xx_naming_it(api):
    server = api(
        max_upload_bytes=2000,
        max_image_pixels=10_000,
        max_question_chars=20,
        max_options=3,
        max_batch_jobs=2,
        max_request_bytes=50_000,
    )
    noise = Image.frombytes("RGB", (64, 64), os.urandom(64 * 64 * 3))
    buffer = io.BytesIO()
    noise.save(buffer, format="PNG")
    cases = [
        (upload(server, buffer.getvalue()), "max_upload_bytes"),
        (upload(server, png((200, 100))), "max_image_pixels"),
        (upload(server, png(), question="x" * 21), "max_question_chars"),
        (upload(server, png(), options=json.dumps(["a", "b", "c", "d"])), "max_options"),
    ]
    job = {"question": "Q?", "image_base64": base64.b64encode(png()).decode()}
    cases.append((server.http.post("/v1/batches", json={"jobs": [job] * 3}), "max_batch_jobs"))
    big = server.http.post("/v1/batches", json={"jobs": [{**job, "id": "x" * 60_000}]})
    cases.append((big, "max_request_bytes"))
    for response, limit in cases:
        assert response.status_code == 413, (limit, response.text)
        body = response.json()
        assert body["error"] == limit and limit in body["detail"]
    assert server.jobs() == 0


def test_bad_input_is_refused_with_one_error_shape_and_creates_nothing(api):
    server = api()
    corrupt = upload(server, b"\x89PNG\r\n\x1a\nbroken")
    assert corrupt.status_code == 422 and corrupt.json()["error"] == "image_invalid"
    not_image = upload(server, b"hello, I am text")
    assert not_image.status_code == 422 and not_image.json()["error"] == "image_invalid"
    no_question = server.http.post("/v1/jobs", files={"image": ("a.png", png())})
    assert no_question.status_code == 422 and no_question.json()["detail"] == (
        "question: Field required"
    )
    assert server.jobs() == 0
    unknown = server.http.get("/v1/jobs/" + "ab" * 16)
    assert unknown.status_code == 404 and set(unknown.json()) == {"error", "detail"}
    malformed = server.http.get("/v1/jobs/not-a-uuid")
    assert malformed.status_code == 422 and malformed.json()["error"] == "invalid_request"
    assert server.http.get("/v1/batches/" + "cd" * 16).status_code == 404
    no_question = server.http.post("/v1/jobs", files={"image": ("a.png", png())})
    assert no_question.status_code == 422 and set(no_question.json()) == {"error", "detail"}
    bad_json = server.http.post(
        "/v1/batches", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert bad_json.status_code == 422 and bad_json.json()["error"] == "invalid_json"
    for form in ({"options": "not json"}, {"batch_id": "nope"}):
        response = upload(server, png(), **form)
        assert response.status_code == 422 and response.json()["error"] == "invalid_request"
    assert upload(server, png(), batch_id="ef" * 16).status_code == 404


def test_the_client_raises_typed_errors(api):
    server = api(max_question_chars=10)
    with pytest.raises(NotFound):
        server.client.get("ab" * 16)
    with pytest.raises(InvalidRequest):
        server.client.get("nope")
    with pytest.raises(LimitExceeded) as limit:
        server.client.submit(png(), "a question that is too long")
    assert limit.value.error == "max_question_chars"
    server.client.submit(png(), "Q?", idempotency_key="same")
    with pytest.raises(Conflict):
        server.client.submit(png((8, 8)), "Q?", idempotency_key="same")
    anonymous = SpecEyesClient(http=TestClient(server.http.app))
    with pytest.raises(Unauthorized):
        anonymous.get("ab" * 16)
    job = server.client.submit(png(), "Q2?")
    with pytest.raises(Timeout):
        server.client.wait(job.id, timeout=0.2, every=0.05)  # nothing runs the jobs here


def test_probes_and_metrics(api):
    server = api()
    assert server.http.get("/healthz").json() == {"status": "ok"}
    ready = server.http.get("/readyz")
    assert ready.status_code == 200 and ready.json()["database"] == "ok"
    job_id = upload(server, png()).json()["id"]
    with server.sessions.begin() as session:  # as if audited, the agent disagreeing
        session.execute(
            update(Job).where(Job.id == job_id).values(audit_status="done", audit_agrees=False)
        )
    metrics = server.http.get("/metrics").text
    assert 'speceyes_api_jobs_submitted_total{route="jobs"}' in metrics
    assert 'speceyes_store_audited_answers{agrees="false"} 1.0' in metrics
    assert "speceyes_store_audit_alarms 0.0" in metrics
    down = api(broker_url="redis://127.0.0.1:1/0")
    response = down.http.get("/readyz")
    assert response.status_code == 503 and response.json()["broker"].startswith("unreachable")
    docs = server.http.get("/openapi.json").json()
    assert "/v1/jobs" in docs["paths"] and "/v1/batches/{batch_id}/results" in docs["paths"]


def test_embedded_serving_runs_a_batch_and_streams_its_results(tmp_path, postgres_url):
    # No broker: the app runs the embedded runner itself (what `speceyes serve` does).
    settings = Settings(
        database_url=postgres_url,
        backend="scripted",
        upload_dir=tmp_path / "uploads",
        fast_batch_size=4,
        api_require_keys=False,
    )
    sessions = open_store(settings.database_url)
    app = create_app(settings, sessions=sessions, dispatcher=make_dispatcher(settings, sessions))
    with TestClient(app) as http:
        client = SpecEyesClient(http=http)
        jobs = [
            {"image": png(colour=(i, 50, 50)), "question": "Q?", "id": f"row{i}", "answer": "A"}
            for i in range(6)
        ]
        batch = client.submit_many(jobs, name="embedded", idempotency_key="b1")
        assert len(batch["job_ids"]) == 6 and batch["created"]
        again = client.submit_many(jobs, name="embedded", idempotency_key="b1")
        assert again == {**batch, "created": False}
        done = client.wait_batch(batch["id"], timeout=60, every=0.1)
        assert done["by_status"] == {"done": 6} and done["progress"] == 1.0
        assert done["beta"] == 1.0 and done["alpha"] == 1.0
        # what it cost: each job's share of its micro-batch's calls, per phase (the agent
        # never ran, so what it saved is not known yet)
        usage = done["usage"]
        assert usage["jobs"] == 6 and usage["accepted"] == 6 and usage["saved"] is None
        assert set(usage["seconds"]) == {"screen", "speculate", "gate"}
        assert usage["tokens_in"] > 0 and usage["tokens_out"] > 0 and usage["cost"] is None
        rows = list(client.results(batch["id"]))
        assert [row["id"] for row in rows] == [f"row{i}" for i in range(6)]
        assert {row["answered_by"] for row in rows} == {"small"}
        assert all(row["correct"] for row in rows)
        trace = client.trace(batch["job_ids"][0])
        assert trace["trajectory"] is None  # answered by the small model: no trajectory
        assert http.get("/readyz").json() == {"ready": True, "database": "ok", "runner": "ok"}
    sessions.close()


def test_end_to_end_through_redis_and_the_workers(tmp_path, broker_env, monkeypatch):
    for key in [key for key in os.environ if key.startswith("SPECEYES_")]:
        monkeypatch.delenv(key)
    env = {
        **broker_env,
        "SPECEYES_UPLOAD_DIR": str(tmp_path / "uploads"),
        "SPECEYES_FAST_BATCH_SIZE": "4",
        "SPECEYES_FAST_MAX_WAIT_S": "0.2",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    sessions = open_store(settings.database_url)
    with sessions.begin() as session:
        key = create_key(session, "e2e")[1]
    images = [png(colour=(i * 20, 90, 90)) for i in range(6)]
    workers = []
    try:
        with TestClient(create_app(settings, dispatcher=CeleryDispatcher(settings))) as http:
            client = SpecEyesClient(http=http, api_key=key)
            jobs = [
                {"image": data, "question": "Q?", "id": f"r{i}"} for i, data in enumerate(images)
            ]
            batch = client.submit_many(jobs)
            # routes, scripted per job id: two need tools, one is unsure, three are easy
            scripts = {
                batch["job_ids"][i]: JobScript(needs_tools=True, agent_answer="T").to_dict()
                for i in (0, 1)
            }
            scripts[batch["job_ids"][2]] = JobScript(confidence=0.6, agent_answer="U").to_dict()
            (tmp_path / "scripts.json").write_text(json.dumps(scripts))
            env["SPECEYES_SCRIPTED__SCRIPTS_FILE"] = str(tmp_path / "scripts.json")
            for pool in ("fast", "slow"):
                workers.append(WorkerProcess(pool, env, tmp_path / f"{pool}.log"))
                workers[-1].wait_ready()
            done = client.wait_batch(batch["id"], timeout=60, every=0.1)
            assert done["by_status"] == {"done": 6}, done
            assert done["by_answerer"] == {"small": 3, "large": 3}
            rows = {row["id"]: row for row in client.results(batch["id"])}
            assert [rows[f"r{i}"]["answer"] for i in range(3)] == ["T", "T", "U"]
            assert rows["r2"]["defer_reason"] == "low_confidence"
            assert client.get(batch["job_ids"][0])["answered_by"] == "large"
            steps = client.trace(batch["job_ids"][0])["trajectory"]["steps"]
            assert len(steps) == 1
    finally:
        for worker in workers:
            worker.stop()
        sessions.close()


def test_speceyes_serve_answers_with_a_key_from_speceyes_keys(tmp_path):
    import subprocess
    import sys

    db = f"sqlite:///{tmp_path / 'serve.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECEYES_")}
    env |= {"SPECEYES_BACKEND": "scripted", "SPECEYES_UPLOAD_DIR": str(tmp_path / "up")}
    command = [sys.executable, "-m", "cli.main"]
    created = subprocess.run(
        [*command, "keys", "create", "cli", "--db", db],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    key = created.stdout.splitlines()[0]
    with reserved_port() as port:  # (held until the server is gone: no other test's)
        server = subprocess.Popen(
            [*command, "serve", "--db", db, "--port", str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            with SpecEyesClient(f"http://127.0.0.1:{port}", api_key=key) as client:

                def up() -> bool:
                    try:
                        return client.http.get("/healthz").status_code == 200
                    except Exception:
                        return False

                wait_until(up, deadline_s=60, what="speceyes serve to answer")
                job = client.submit(png(), "What colour?")
                done = client.wait(job.id, timeout=30, every=0.1)
                assert (done["status"], done["answered_by"]) == ("done", "small")
        finally:
            server.terminate()
            server.wait(timeout=20)


def test_the_api_imports_neither_torch_nor_the_workers():
    import subprocess
    import sys

    probe = (
        "import sys, api.app, api.client; print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('torch', 'transformers', 'workers', 'celery')))"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"


def test_a_batch_with_bad_jobs_runs_the_good_ones_and_names_each_bad_one(api, tmp_path):
    """As annotate does: a job that is wrong fails alone, with the code and reason it
    would have been refused with; the response names it (index, id, job); the rest runs."""
    server = api(max_question_chars=50)
    good = {"question": "Q?", "image_base64": base64.b64encode(png()).decode()}
    (server.root / "notes.png").write_text("I am text")
    jobs = [
        {**good, "id": "fine"},
        {"question": "Q?", "image_base64": base64.b64encode(b"not an image").decode()},
        {**good, "id": "long", "question": "x" * 51},
        {**good, "id": "b64", "image_base64": "%%%"},
        {"id": "text", "question": "Q?", "image_path": str(server.root / "notes.png")},
        {"id": "typed", "question": 7},
        {**good, "id": "also fine", "question": "Other?"},
    ]
    response = server.http.post("/v1/batches", json={"name": "mixed", "jobs": jobs})
    assert response.status_code == 202, response.text
    body = response.json()
    assert len(body["job_ids"]) == 7
    refused = {item["index"]: item for item in body["refused"]}
    assert {index: item["error"] for index, item in refused.items()} == {
        1: "image_invalid",
        2: "max_question_chars",
        3: "image_base64_invalid",
        4: "image_invalid",
        5: "invalid_request",
    }
    assert [refused[i]["id"] for i in (1, 2, 5)] == ["1", "long", "typed"]
    assert all(refused[i]["job_id"] == body["job_ids"][i] for i in refused)
    assert "max_question_chars" in refused[2]["detail"]
    for index in (0, 6):  # the good ones were sent on to run
        assert body["job_ids"][index] in server.enqueued
    for index, item in refused.items():
        job = server.client.get(item["job_id"])
        assert job["status"] == "failed" and job["error"]["code"] == item["error"], index
        timings = job["timings"]  # failed as it was created: never finished before it
        assert timings["finished_at"] == timings["created_at"], timings
    batch = server.client.batch(body["id"])
    assert batch["jobs"] == 7 and batch["failures"] == {
        "image_invalid": 2,
        "max_question_chars": 1,
        "image_base64_invalid": 1,
        "invalid_request": 1,
    }


def test_the_client_submits_a_folder_with_a_broken_file(api, tmp_path):
    server = api()
    (tmp_path / "a.png").write_bytes(png())
    (tmp_path / "empty.png").write_bytes(b"")
    jobs = [
        {"image": tmp_path / name, "question": "Q?", "id": name} for name in ("a.png", "empty.png")
    ]
    submitted = server.client.submit_many(jobs, name="folder")
    assert [item["id"] for item in submitted["refused"]] == ["empty.png"]
    assert submitted["refused"][0]["error"] == "image_invalid"


def test_a_server_run_with_method_specreason_sends_its_jobs_straight_to_the_agent(api):
    """``serve --method specreason``: jobs skip phases I-III (deferred, reason specreason,
    sent to the slow queue), one at a time or in a batch."""
    server = api(funnel={"method": "specreason"})
    one = upload(server, png())
    assert one.status_code == 202, one.text
    assert one.json()["status"] == "deferred"
    image = base64.b64encode(png((20, 20))).decode()
    jobs = [{"question": question, "image_base64": image} for question in ("Q1?", "Q2?")]
    batch = server.http.post("/v1/batches", json={"jobs": jobs})
    assert batch.status_code in (200, 201, 202), batch.text
    with server.sessions() as session:
        jobs = session.query(Job).all()
    assert len(jobs) == 3
    assert {(job.status, job.defer_reason) for job in jobs} == {("deferred", "specreason")}
    assert sorted(server.dispatcher.sent_slow) == sorted(job.id for job in jobs)
    assert server.enqueued == []  # nothing went to the fast stage
    with server.sessions() as session:  # the report tells its batch from a funnel's
        batch = session.get(Batch, batch.json()["id"])
        assert batch is not None and batch.config == {"method": "specreason"}


def test_the_docs_page_is_served_whole_by_this_server(api):
    server = api()
    page = server.http.get("/docs")
    assert page.status_code == 200
    assert "/docs/assets/swagger-ui-bundle.js" in page.text and "https://" not in page.text
    script = server.http.get("/docs/assets/swagger-ui-bundle.js")
    assert script.status_code == 200 and len(script.content) > 100_000
    assert server.http.get("/docs/assets/swagger-ui.css").status_code == 200
