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
from functools import partial

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session, sessionmaker

from api.deps import CallerDep, DispatcherDep, SessionsDep, SettingsDep
from api.errors import ApiError
from api.intake import enqueue_job, read_json
from api.openai.files import stored_image
from api.openai.requests import item_of, model_names, read_chat
from api.openai.shapes import (
    ChatCompletion,
    Model,
    ModelList,
    completion_of,
)
from common.contracts import FINISHED, JobStatus, Priority
from common.store.tables import Job

router = APIRouter(tags=["openai"])

# An answer about a job that exists: the SDK, which retries a 409 or a 5xx by itself, is
# told not to (each retry would be a new job); the job is at /v1/jobs/{id}.
NO_RETRY = {"x-should-retry": "false"}
_LISTED_AT = int(time.time())  # (a model's "created": when this server started)


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
    asked = read_chat(await read_json(request), settings)
    rank = caller.priority(None, Priority.HIGH)
    uploaded = partial(stored_image, sessions, caller)
    item = await run_in_threadpool(item_of, asked, 0, "", settings, rank, uploaded)
    made = await run_in_threadpool(
        enqueue_job, sessions, dispatcher, item, caller, settings, method=asked.method
    )
    job = await _finished(sessions, made.id, settings.api.chat_wait_s)
    return _completion(job, asked.model)


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
                NO_RETRY,
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
        raise ApiError(
            409, "job_cancelled", f"job {job.id} was cancelled before it answered", NO_RETRY
        )
    if job.status == JobStatus.FAILED:
        raise ApiError(
            502,
            job.error_code or "job_failed",
            f"job {job.id} failed: {job.error_message}",
            NO_RETRY,
        )
    return completion_of(job, model)
