"""The OpenAI-compatible chat route, driven by the official ``openai`` SDK: a real
``speceyes serve`` answers a question about an image; what the funnel cannot honour is
refused in OpenAI's error shape, which the SDK reads into its exceptions, and makes no
job."""

from __future__ import annotations

import base64
import io
import os
from pathlib import Path

import httpx
import openai
import pytest

from tests.helpers.images import png
from tests.helpers.live_app import live_app
from tests.helpers.serving import served

IMAGE = "data:image/png;base64," + base64.b64encode(png()).decode()


def _message(text: str, *urls: str) -> list[dict]:
    images = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [{"type": "text", "text": text}, *images]}]


@pytest.mark.integration
def test_the_sdk_lists_the_models_and_a_real_server_answers_its_chat(tmp_path: Path):
    db = f"sqlite:///{tmp_path / 's.db'}"
    env = {**os.environ, "SPECEYES_UPLOAD_DIR": str(tmp_path / "up")}
    with served(tmp_path, env, "--backend", "scripted", "--db", db) as server:
        client = openai.OpenAI(base_url=f"{server.base}/openai/v1", api_key=server.key)
        assert sorted(model.id for model in client.models.list()) == [
            "speceyes-deepeyes",
            "specreason-deepeyes",
        ]
        completion = client.chat.completions.create(
            model="speceyes-deepeyes",
            messages=_message("What colour is the square?", IMAGE),
            extra_body={"speceyes": {"options": ["red", "blue"]}},
        )
        assert completion.object == "chat.completion" and completion.model == "speceyes-deepeyes"
        (choice,) = completion.choices
        assert choice.message.role == "assistant" and choice.message.content
        assert choice.finish_reason == "stop"
        facts = completion.model_extra["speceyes"]
        assert facts["answered_by"] in ("small", "large")
        assert completion.id == f"chatcmpl-{facts['job_id']}"
        headers = {"Authorization": f"Bearer {server.key}"}
        job = httpx.get(f"{server.base}/v1/jobs/{facts['job_id']}", headers=headers).json()
        assert (job["priority"], job["options"], job["status"]) == ("high", ["red", "blue"], "done")
        assert job["final_answer"] == choice.message.content
        assert job["question"] == "What colour is the square?"
        assert completion.usage.prompt_tokens == 0  # (we count what the models generate)
        assert completion.usage.total_tokens == completion.usage.completion_tokens
        # an image uploaded once (purpose=vision) and named by its file id
        uploaded = client.files.create(file=("a.png", io.BytesIO(png())), purpose="vision")
        by_id = client.chat.completions.create(
            model="speceyes-deepeyes", messages=_message("What colour is the square?", uploaded.id)
        )
        assert by_id.choices[0].message.content
        shown = by_id.model_extra["speceyes"]["job_id"]
        shown_job = httpx.get(f"{server.base}/v1/jobs/{shown}", headers=headers).json()
        assert shown_job["status"] == "done" and shown_job["options"] is None
        with pytest.raises(openai.NotFoundError) as unknown:
            client.chat.completions.create(
                model="speceyes-deepeyes", messages=_message("Q?", "file-" + "0" * 32)
            )
        assert unknown.value.code == "file_not_found"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{server.base}/openai/v1", api_key="nope").models.list()


def test_what_the_funnel_cannot_honour_is_refused_in_openais_shape_and_makes_no_job(api):
    served_api = api(api_chat_wait_s=0.3)
    with live_app(served_api.http.app) as base:
        client = openai.OpenAI(base_url=f"{base}/openai/v1", api_key=served_api.key, max_retries=0)
        model = "speceyes-deepeyes"
        one = _message("Q?", IMAGE)
        refusals = [
            (dict(model=model, messages=one, stream=True), "stream_unsupported"),
            (dict(model=model, messages=one, n=2), "n_unsupported"),
            (dict(model=model, messages=one, temperature=0.7), "temperature_unsupported"),
            (
                dict(
                    model=model,
                    messages=one,
                    tools=[{"type": "function", "function": {"name": "zoom"}}],
                ),
                "tools_unsupported",
            ),
            (dict(model=model, messages=_message("Q?", IMAGE, IMAGE)), "one_image"),
            (dict(model=model, messages=_message("Q?")), "one_image"),
            (
                dict(model=model, messages=_message("Q?", "http://example.com/a.png")),
                "image_url_refused",
            ),
            (
                dict(model=model, messages=[{"role": "system", "content": "Be brief."}, *one]),
                "one_user_message",
            ),
            (
                dict(
                    model=model,
                    messages=_message(
                        "Q?", "data:image/png;base64," + base64.b64encode(b"no").decode()
                    ),
                ),
                "image_invalid",
            ),
            (dict(model=model, messages=_message("   ", IMAGE)), "question_missing"),
        ]
        for request, code in refusals:
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(**request)
            assert refused.value.code == code, (code, refused.value.body)
            assert refused.value.type == "invalid_request_error" and refused.value.message
        with pytest.raises(openai.NotFoundError) as unknown:
            client.chat.completions.create(model="gpt-4o", messages=one)
        assert unknown.value.code == "model_not_found" and "speceyes-deepeyes" in str(unknown.value)
        assert served_api.jobs() == 0
        # no worker here: the job waits, and the answer says where to find it; the SDK,
        # which retries a 5xx twice by default, is told not to (each try a new job)
        retrying = openai.OpenAI(base_url=f"{base}/openai/v1", api_key=served_api.key)
        with pytest.raises(openai.InternalServerError) as late:
            retrying.chat.completions.create(model=model, messages=one)
        assert late.value.status_code == 504 and late.value.code == "answer_timeout"
        assert served_api.jobs() == 1 and served_api.enqueued[0] in late.value.message
