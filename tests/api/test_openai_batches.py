"""OpenAI's batch interface, driven by the official ``openai`` SDK against a real
``speceyes serve``: a file of chat requests becomes one of our batches, its output file
parses with the SDK's types keyed one to one by custom_id, the broken lines are in the
error file with their reasons, and cancel and expiry keep what finished."""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import subprocess
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion

from tests.helpers.images import png
from tests.helpers.serving import SPECEYES, served
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.integration

MODEL = "speceyes-deepeyes"


def _image(colour: tuple[int, int, int]) -> str:
    return "data:image/png;base64," + base64.b64encode(png(colour=colour)).decode()


def _request(custom_id: str, text: str, *urls: str, model: str = MODEL) -> dict:
    images = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    content = [{"type": "text", "text": text}, *images]
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def _jsonl(lines: list) -> bytes:
    return "".join(
        line if isinstance(line, str) else json.dumps(line) + "\n" for line in lines
    ).encode()


def _server(tmp_path: Path, **scripted: str):
    db = f"sqlite:///{tmp_path / 's.db'}"
    env = {
        **os.environ,
        "SPECEYES_UPLOAD_DIR": str(tmp_path / "up"),
        "SPECEYES_API_MAX_FILE_BYTES": "50000",
        **{f"SPECEYES_SCRIPTED__{name.upper()}": value for name, value in scripted.items()},
    }
    return served(tmp_path, env, "--backend", "scripted", "--db", db), db, env


def _lines(client: openai.OpenAI, file_id: str) -> list[dict]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def _ended(client: openai.OpenAI, batch_id: str):
    ended = ("completed", "cancelled", "expired", "failed")
    wait_until(
        lambda: client.batches.retrieve(batch_id).status in ended,
        deadline_s=120,
        what=f"batch {batch_id} to end",
    )
    return client.batches.retrieve(batch_id)


def test_a_file_of_requests_is_answered_and_each_broken_line_fails_alone(tmp_path: Path):
    good = [_request(f"good-{n}", "What colour?", _image((n * 40, 10, 10))) for n in range(4)]
    lines = [
        *good,
        "{not json\n",
        _request("other-model", "Q?", _image((1, 2, 3)), model="specreason-deepeyes"),
        _request("unknown-model", "Q?", _image((1, 2, 3)), model="gpt-4o"),
        _request("two-images", "Q?", _image((1, 2, 3)), _image((3, 2, 1))),
        _request("a-url", "Q?", "http://169.254.169.254/latest/image.png"),
        _request("broken-image", "Q?", "data:image/png;base64," + base64.b64encode(b"no").decode()),
        {**_request("streamed", "Q?", _image((5, 5, 5))), "url": "/v1/completions"},
        "\n",  # (a blank line: skipped, and counted in the lines' numbers)
        {**_request("x", "Q?", _image((6, 6, 6))), "custom_id": "nul\u0000id"},
        _request("long-question", "Q" * 5000, _image((7, 7, 7))),
        {
            **_request("one-option", "Q?", _image((8, 8, 8))),
            "body": {
                **_request("o", "Q?", _image((8, 8, 8)))["body"],
                "speceyes": {"options": ["a"]},
            },
        },
    ]
    server, _, env = _server(tmp_path)
    with server as server:
        client = openai.OpenAI(base_url=f"{server.base}/openai/v1", api_key=server.key)
        uploaded = client.files.create(
            file=("requests.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch"
        )
        assert uploaded.purpose == "batch" and uploaded.bytes == len(_jsonl(lines))
        batch = client.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"run": "nightly"},
        )
        assert batch.status == "in_progress" and batch.metadata == {"run": "nightly"}
        batch = _ended(client, batch.id)
        assert batch.status == "completed"
        assert batch.request_counts.model_dump() == {"total": 14, "completed": 4, "failed": 10}
        out = _lines(client, batch.output_file_id)
        assert sorted(line["custom_id"] for line in out) == [f"good-{n}" for n in range(4)]
        for line in out:
            completion = ChatCompletion.model_validate(line["response"]["body"])
            assert completion.choices[0].message.content and completion.model == MODEL
            assert line["response"]["status_code"] == 200 and line["error"] is None
        failed = _lines(client, batch.error_file_id)
        errors = {line["custom_id"]: line for line in failed}
        codes = {
            custom_id: line["response"]["body"]["error"]["code"]
            for custom_id, line in errors.items()
        }
        # (the unreadable line and the unusable custom_id have none: null, and their
        # messages name their lines)
        unnamed = sorted(
            line["response"]["body"]["error"]["message"].split(":")[0]
            for line in failed
            if line["custom_id"] is None
        )
        assert unnamed == ["line 13", "line 5"]
        assert codes == {
            None: "invalid_custom_id",
            "long-question": "max_question_chars",
            "one-option": "options_too_few",
            "other-model": "model_mismatch",
            "unknown-model": "model_not_found",
            "two-images": "one_image",
            "a-url": "image_url_refused",
            "broken-image": "image_invalid",
            "streamed": "url_unsupported",
        }
        assert all(line["response"]["body"]["error"]["message"] for line in errors.values())
        # it is one of ours: listed, with its rows
        headers = {"Authorization": f"Bearer {server.key}"}
        ours = httpx.get(f"{server.base}/v1/batches", headers=headers).json()["data"]
        assert [line["name"] for line in ours] == ["openai requests.jsonl"]
        assert [one.id for one in client.batches.list()] == [batch.id]
        # what is refused before any batch is made, in OpenAI's shape
        with pytest.raises(openai.APIStatusError) as large:
            client.files.create(file=("big.jsonl", io.BytesIO(b"x" * 60_000)), purpose="batch")
        assert large.value.status_code == 413 and large.value.code == "max_file_bytes"
        made = subprocess.run(
            [
                *SPECEYES,
                "keys",
                "create",
                "other",
                "--tenant",
                "other",
                "--db",
                f"sqlite:///{tmp_path / 's.db'}",
            ],
            env=env,
            capture_output=True,
            check=True,
        )
        stranger = openai.OpenAI(
            base_url=f"{server.base}/openai/v1", api_key=made.stdout.decode().split()[0]
        )
        with pytest.raises(openai.NotFoundError) as theirs:
            stranger.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        assert theirs.value.code == "file_not_found"
        with pytest.raises(openai.NotFoundError):
            stranger.batches.retrieve(batch.id)
        with pytest.raises(openai.NotFoundError):
            stranger.files.content(batch.output_file_id)
        # an ended batch is not cancelled after the fact
        assert client.batches.cancel(batch.id).status == "completed"
        # two lines with one custom_id: which answer is whose? the batch is refused
        twins = _jsonl([good[0], good[0]])
        twin_file = client.files.create(file=("t.jsonl", io.BytesIO(twins)), purpose="batch")
        with pytest.raises(openai.BadRequestError) as twice:
            client.batches.create(
                input_file_id=twin_file.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        assert twice.value.code == "duplicate_custom_id" and "lines 1 and 2" in twice.value.message
        with pytest.raises(openai.BadRequestError) as labels:
            client.batches.create(
                input_file_id=uploaded.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
                metadata={f"k{n}": "v" for n in range(17)},
            )
        assert labels.value.code == "invalid_request"
        # ids of other forms, or that the store cannot hold, are absent: 404, not 500
        raw = httpx.Client(base_url=f"{server.base}/openai/v1", headers=headers)
        for path in ("/files/%00", "/files/file-%00-output/content", "/batches/batch_%00"):
            answer = raw.get(path)
            assert answer.status_code == 404 and answer.json()["error"]["code"], (path, answer.text)
        assert raw.get("/batches", params={"after": "\x00"}).status_code == 400
        # a body declared over the limit is refused before it is read, in OpenAI's shape
        port = int(server.base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            connection.sendall(
                b"POST /openai/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: 1000000000000\r\n\r\n"
            )
            answer = ""
            while "}}" not in answer:  # (the head and the body may come apart)
                chunk = connection.recv(65536).decode()
                assert chunk, answer
                answer += chunk
        assert answer.startswith("HTTP/1.1 413"), answer
        assert json.loads(answer.split("\r\n\r\n", 1)[1])["error"]["code"] == "max_request_bytes"


def test_cancel_and_expiry_keep_what_finished(tmp_path: Path):
    # every job goes to the agent, a second a step: slow enough to stop halfway
    server, _, _ = _server(tmp_path, tool_free="0.0", agent_step_s="0.4")
    with server as server:
        client = openai.OpenAI(base_url=f"{server.base}/openai/v1", api_key=server.key)
        lines = [_request(f"r{n}", "Q?", _image((n * 9, 0, 0))) for n in range(12)]
        file = client.files.create(file=("slow.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
        made = client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        wait_until(
            lambda: client.batches.retrieve(made.id).request_counts.completed >= 1,
            deadline_s=60,
            what="a first answer",
        )
        cancelling = client.batches.cancel(made.id)
        assert cancelling.status in ("cancelling", "cancelled")
        cancelled = _ended(client, made.id)
        assert cancelled.status == "cancelled"
        counts = cancelled.request_counts
        assert 1 <= counts.completed < 12 and counts.completed + counts.failed == 12
        kept = client.files.content(cancelled.output_file_id).text.splitlines()
        assert len(kept) == counts.completed
        stopped = _lines(client, cancelled.error_file_id)
        assert {line["error"]["code"] for line in stopped} == {"batch_cancelled"}

        late = client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="3s"
        )
        expired = _ended(client, late.id)
        assert expired.status == "expired" and expired.expired_at is not None
        assert expired.request_counts.completed < 12
        stopped = _lines(client, expired.error_file_id)
        assert {line["error"]["code"] for line in stopped} == {"batch_expired"}
        # no one looks through /openai/v1: the API's own sweep expires it all the same
        unwatched = client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="2s"
        ).id.removeprefix("batch_")
        headers = {"Authorization": f"Bearer {server.key}"}
        wait_until(
            lambda: (
                httpx.get(f"{server.base}/v1/batches/{unwatched}", headers=headers)
                .json()["by_status"]
                .get("cancelled", 0)
                > 0
            ),
            deadline_s=60,
            what="the window's sweep",
        )
        # cancelled through /v1, it reads as cancelled through /openai/v1
        other = client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        httpx.post(
            f"{server.base}/v1/batches/{other.id.removeprefix('batch_')}/cancel", headers=headers
        )
        assert _ended(client, other.id).status == "cancelled"
        with pytest.raises(openai.BadRequestError) as window:
            client.batches.create(
                input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="48h"
            )
        assert window.value.code == "completion_window_unsupported"
