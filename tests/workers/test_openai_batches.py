"""OpenAI's batch path on the distributed pipeline: the API commits the batch's jobs and
sends them through Redis; fast and slow worker processes answer them; the SDK reads the
output file (the same store, PostgreSQL)."""

from __future__ import annotations

import base64
import io
import json

import openai
import pytest
from openai.types.chat import ChatCompletion

from api.app import create_app
from common.store.keys import create_key
from tests.helpers.images import png
from tests.helpers.live_app import live_app
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.integration


def test_the_sdks_batch_is_answered_by_the_workers(deployment, tmp_path):
    setup = deployment(upload_dir=str(tmp_path / "uploads"), scripted__tool_free="0.5")
    setup.start("fast")
    setup.start("slow")
    with setup.sessions.begin() as session:
        key = create_key(session, "caller")[1]
    app = create_app(setup.settings, sessions=setup.sessions, dispatcher=setup.dispatcher)
    lines = []
    for n in range(6):
        url = "data:image/png;base64," + base64.b64encode(png(colour=(n * 30, 0, 0))).decode()
        content = [
            {"type": "text", "text": "What colour?"},
            {"type": "image_url", "image_url": {"url": url}},
        ]
        body = {"model": "speceyes-deepeyes", "messages": [{"role": "user", "content": content}]}
        lines.append(
            {"custom_id": f"r{n}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        )
    with live_app(app) as base:
        client = openai.OpenAI(base_url=f"{base}/openai/v1", api_key=key)
        data = "".join(json.dumps(line) + "\n" for line in lines).encode()
        file = client.files.create(file=("r.jsonl", io.BytesIO(data)), purpose="batch")
        batch = client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        wait_until(
            lambda: client.batches.retrieve(batch.id).status == "completed",
            deadline_s=120,
            what="the workers to answer the batch",
        )
        done = client.batches.retrieve(batch.id)
        answered = (
            client.files.content(done.output_file_id).text.splitlines()
            if done.output_file_id
            else []
        )
        failed = (
            client.files.content(done.error_file_id).text.splitlines() if done.error_file_id else []
        )
    ids = sorted(json.loads(line)["custom_id"] for line in [*answered, *failed])
    assert ids == [f"r{n}" for n in range(6)]
    assert done.request_counts.completed == len(answered) >= 3
    for line in answered:
        ChatCompletion.model_validate(json.loads(line)["response"]["body"])
