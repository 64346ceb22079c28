"""``POST /openai/v1/chat/completions`` and ``GET /openai/v1/models``.

A chat request is one job: its one user message holds one image (a ``data:`` URL) and
the question as text; the options, where the text does not list them itself, go under
``speceyes.options``. The job is sent at high priority (as ``POST /v1/jobs``), and the
answer waited for, up to ``api.chat_wait_s``. What the funnel cannot honour (streaming,
several images or messages, tools, ``n > 1``, a temperature other than the method's
greedy 0) is refused with a 400 that says so, before any job is made.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session, sessionmaker

from api.deps import CallerDep, DispatcherDep, SessionsDep, SettingsDep
from api.errors import ApiError
from api.intake import check_spec, enqueue_job, image_from_base64, read_json, validated
from api.openai.shapes import (
    AnswerMessage,
    ChatCompletion,
    ChatRequest,
    Choice,
    Facts,
    Message,
    Model,
    ModelList,
)
from api.schemas import JobSpec
from common.config import Method, Settings
from common.contracts import FINISHED, JobStatus, Priority
from common.store.new_jobs import NewItem
from common.store.tables import Job

router = APIRouter(tags=["openai"])

METHODS: tuple[Method, ...] = ("speceyes", "specreason")
_LISTED_AT = int(time.time())  # (a model's "created": when this server started)


def model_names(settings: Settings) -> dict[str, Method]:
    """The models a caller may name: each method, on the agent this deployment runs."""
    return {f"{method}-{settings.agent.kind}": method for method in METHODS}


@router.get("/models", response_model=ModelList, summary="The models: a method on our agent")
def list_models(settings: SettingsDep) -> ModelList:
    names = model_names(settings)
    return ModelList(data=[Model(id=name, created=_LISTED_AT) for name in names])


@router.post(
    "/chat/completions",
    response_model=ChatCompletion,
    summary="One image and one question answered by the funnel (waits for the answer)",
)
async def chat_completions(
    request: Request,
    caller: CallerDep,
    settings: SettingsDep,
    sessions: SessionsDep,
    dispatcher: DispatcherDep,
) -> ChatCompletion:
    body = validated(ChatRequest, await read_json(request))
    method = _method(body.model, settings)
    _refuse_what_the_funnel_cannot_honour(body)
    question, url = _question_and_image(body.messages)
    options = body.speceyes.options if body.speceyes else None
    check_spec(JobSpec(question=question, options=options), settings)
    stored = await run_in_threadpool(image_from_base64, _data_url_payload(url), settings)
    item = NewItem(
        0,
        "",
        question,
        options,
        stored.path,
        stored.digest,
        priority=caller.priority(None, Priority.HIGH),
    )
    made = await run_in_threadpool(
        enqueue_job, sessions, dispatcher, item, caller, settings, method=method
    )
    job = await _finished(sessions, made.id, settings.api.chat_wait_s)
    return _completion(job, body.model)


def _method(model: str, settings: Settings) -> Method:
    names = model_names(settings)
    if model not in names:
        raise ApiError(
            404,
            "model_not_found",
            f"the model {model[:80]!r} does not exist here; the models are "
            f"{', '.join(names)} (GET /openai/v1/models)",
        )
    return names[model]


def _refuse_what_the_funnel_cannot_honour(body: ChatRequest) -> None:
    if body.stream:
        raise ApiError(400, "stream_unsupported", "stream: the funnel answers whole answers only")
    if body.n not in (None, 1):
        raise ApiError(400, "n_unsupported", "n: the funnel gives one answer a request")
    if body.tools or body.functions:
        raise ApiError(
            400,
            "tools_unsupported",
            "tools: the agent's own tools are the protocol's; a caller's are not offered to it",
        )
    if body.temperature not in (None, 0.0):
        raise ApiError(
            400,
            "temperature_unsupported",
            f"temperature {body.temperature}: the method decodes greedily (temperature 0, "
            "as its gate was calibrated); leave it out or send 0",
        )


def _question_and_image(messages: list[Message]) -> tuple[str, str]:
    """The one user message's text (its parts joined by newlines) and its image's URL."""
    if len(messages) != 1 or messages[0].role != "user":
        raise ApiError(
            400,
            "one_user_message",
            "messages: exactly one, from the user (the agent's system prompt is the "
            "protocol's own; a conversation is not continued)",
        )
    content = messages[0].content
    parts = content if isinstance(content, list) else []
    texts = [part.text or "" for part in parts if part.type == "text"]
    images = [part.image_url.url for part in parts if part.type == "image_url" and part.image_url]
    others = sorted({part.type for part in parts} - {"text", "image_url"})
    if others:
        raise ApiError(400, "content_unsupported", f"content parts of type {others} are not read")
    if len(images) != 1:
        raise ApiError(
            400,
            "one_image",
            f"the message holds {len(images)} images; a request is one image and one question",
        )
    question = "\n".join(text for text in texts if text.strip())
    if not question:
        raise ApiError(400, "question_missing", "the message holds no text: the question")
    return question, images[0]


def _data_url_payload(url: str) -> str:
    """The base64 of a ``data:image/...;base64,`` URL; any other URL is refused."""
    head, comma, payload = url.partition(",")
    if not (head.startswith("data:") and head.endswith(";base64") and comma):
        raise ApiError(
            400,
            "image_url_refused",
            "image_url: this server fetches no URLs; send the image inline as "
            "data:image/...;base64,...",
        )
    return payload


async def _finished(sessions: sessionmaker[Session], job_id: str, wait_s: float) -> Job:
    """The job once it has finished, read again until then (a short pause, doubling to
    half a second); a 504 naming it past ``wait_s``."""
    deadline = time.monotonic() + wait_s
    pause = 0.02
    while True:
        job = await run_in_threadpool(_read, sessions, job_id)
        if job.status in FINISHED:
            return job
        left = deadline - time.monotonic()
        if left <= 0:
            raise ApiError(
                504,
                "answer_timeout",
                f"job {job_id} has not finished within api.chat_wait_s ({wait_s:g} s); it "
                f"goes on: GET /v1/jobs/{job_id}",
            )
        await asyncio.sleep(min(pause, left))
        pause = min(2 * pause, 0.5)


def _read(sessions: sessionmaker[Session], job_id: str) -> Job:
    with sessions() as session:
        job = session.get(Job, job_id)
        assert job is not None  # (committed before it was waited for)
        session.expunge(job)
        return job


def _completion(job: Job, model: str) -> ChatCompletion:
    if job.status == JobStatus.CANCELLED:
        raise ApiError(409, "job_cancelled", f"job {job.id} was cancelled before it answered")
    if job.status == JobStatus.FAILED:
        raise ApiError(
            502, job.error_code or "job_failed", f"job {job.id} failed: {job.error_message}"
        )
    facts = Facts(
        job_id=job.id,
        answered_by=job.answered_by,
        confidence=job.confidence if job.answered_by == "small" else None,
        trajectory=f"/v1/jobs/{job.id}/trace",
    )
    return ChatCompletion(
        id=f"chatcmpl-{job.id}",
        created=int(job.created_at.timestamp()),
        model=model,
        choices=[Choice(message=AnswerMessage(content=job.given_answer))],
        speceyes=facts,
    )
