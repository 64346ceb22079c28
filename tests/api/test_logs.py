"""What ``speceyes serve`` logs: a line per request, a line per failed job; never a key."""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import sys
from pathlib import Path

import httpx

from common.logs import JsonFormatter, TextFormatter
from tests.helpers.api import upload
from tests.helpers.images import png
from tests.helpers.serving import served
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def test_every_request_is_one_line_with_its_route_status_time_and_key_name(api, caplog):
    server = api(max_question_chars=20)
    caplog.set_level(logging.INFO, logger="speceyes.access")
    anonymous = httpx.Headers({"authorization": "Bearer sk-wrong-secret"})
    server.http.get("/v1/jobs/" + "ab" * 16, headers=anonymous)
    job_id = upload(server, png()).json()["id"]
    server.http.get(f"/v1/jobs/{job_id}")
    upload(server, b"not an image")
    upload(server, png(), question="x" * 21)
    server.http.get("/no/such/route")
    lines = [record.fields for record in caplog.records if record.name == "speceyes.access"]
    seen = [(line["method"], line["route"], line["status"], line["key"]) for line in lines]
    assert seen == [
        ("GET", "/v1/jobs/{job_id}", 401, "-"),
        ("POST", "/v1/jobs", 202, "tests"),
        ("GET", "/v1/jobs/{job_id}", 200, "tests"),
        ("POST", "/v1/jobs", 422, "tests"),
        ("POST", "/v1/jobs", 413, "tests"),
        ("GET", "(no route)", 404, "-"),
    ]
    assert all(line["ms"] >= 0 and line["client"] for line in lines)
    text = "\n".join(TextFormatter().format(record) for record in caplog.records)
    assert server.key not in text and "sk-wrong-secret" not in text


def test_a_json_line_holds_the_message_and_every_field():
    record = logging.LogRecord("speceyes.jobs", logging.WARNING, "x", 1, "job failed", (), None)
    record.fields = {"job": "j1", "stage": "fast", "error": "image_error", "reason": "a b\n"}
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "job failed" and line["level"] == "WARNING"
    assert (line["job"], line["error"], line["reason"]) == ("j1", "image_error", "a b\n")
    assert line["time"].endswith("+00:00")
    # text: a value with a space or a control character is quoted and escaped
    assert TextFormatter().format(record).endswith('error=image_error reason="a b\\n"')
    try:
        raise ValueError("boom")
    except ValueError:
        record.exc_info = sys.exc_info()
    text = TextFormatter().format(record)  # a logged exception keeps its traceback
    assert "Traceback (most recent call last)" in text and "ValueError: boom" in text


def test_serve_logs_requests_and_failed_jobs_as_json_lines(tmp_path: Path):
    db = f"sqlite:///{tmp_path / 's.db'}"
    env = {**os.environ, "SPECEYES_UPLOAD_DIR": str(tmp_path / "up")}
    flags = ["--backend", "scripted", "--db", db, "--log-format", "json"]
    with served(tmp_path, env, *flags) as server:

        def lines() -> list[dict]:
            return [json.loads(line) for line in server.stderr().splitlines() if line]

        good = {"question": "Q?", "image_base64": base64.b64encode(png()).decode()}
        bad = {**good, "image_base64": base64.b64encode(b"broken").decode()}
        headers = {"Authorization": f"Bearer {server.key}"}
        base = server.base
        answer = httpx.post(f"{base}/v1/batches", json={"jobs": [good, bad]}, headers=headers)
        assert answer.status_code == 202
        httpx.get(f"{base}/v1/batches/{answer.json()['id']}", headers={"X-API-Key": "nope"})
        wait_until(
            lambda: sum(line["logger"] == "speceyes.access" for line in lines()) >= 3,
            deadline_s=30,
            what=server.stderr,
        )
        server.process.send_signal(signal.SIGINT)
        server.process.wait(timeout=30)
    logged = lines()
    access = [line for line in logged if line["logger"] == "speceyes.access"]
    assert [(a["route"], a["status"], a["key"]) for a in access][-2:] == [
        ("/v1/batches", 202, "test"),
        ("/v1/batches/{batch_id}", 401, "-"),
    ]
    (failed,) = [line for line in logged if line["logger"] == "speceyes.jobs"]
    assert failed["job"] == answer.json()["refused"][0]["job_id"]
    assert failed["error"] == "image_invalid" and failed["stage"] == "intake"
    assert server.key not in server.stderr()
