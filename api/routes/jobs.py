"""``/v1/jobs``: submit one job, read it back, read its agent trajectory, see its image
(and an agent's zooms), review its answer, cancel it."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from api.browse import (
    After,
    CreatedFrom,
    CreatedTo,
    Limit,
    ReviewSpec,
    image_response,
    owned_batch,
    owned_job,
    review,
    window,
)
from api.deps import CallerDep, DispatcherDep, SessionsDep, SettingsDep
from api.errors import ApiError
from api.intake import checked_callback, enqueue_job, new_item, parse_id, read_job
from api.metrics import SUBMITTED, TENANT_SUBMITTED
from api.quotas import quotas_of
from api.schemas import JobsPage, JobSpec, JobSubmitted, JobView
from common.contracts import JobStatus, Priority
from common.pipeline import cancel
from common.store.listing import jobs_page

router = APIRouter(prefix="/jobs", tags=["jobs"])

UPLOAD_FORM = {  # the multipart body, for the OpenAPI docs (FastAPI reads the form by hand)
    "type": "object",
    "required": ["image", "question"],
    "properties": {
        "image": {"type": "string", "format": "binary"},
        "question": {"type": "string"},
        "options": {"type": "string", "description": "JSON list of options"},
        **{
            name: {"type": "string"}
            for name in ("idempotency_key", "batch_id", "id", "priority", "callback_url")
        },
    },
}


@router.post(
    "",
    status_code=202,
    response_model=JobSubmitted,
    openapi_extra={
        "requestBody": {
            "content": {
                "multipart/form-data": {"schema": UPLOAD_FORM},
                "application/json": {"schema": JobSpec.model_json_schema()},
            }
        }
    },
    summary="Submit one job (multipart upload, or JSON with base64 or a server path)",
)
async def submit_job(
    request: Request,
    caller: CallerDep,
    settings: SettingsDep,
    sessions: SessionsDep,
    dispatcher: DispatcherDep,
) -> JobSubmitted:
    spec, stored = await read_job(request, settings)
    callback = None if spec.callback_url is None else checked_callback(spec.callback_url, settings)
    if callback is not None and spec.batch_id:
        raise ApiError(
            422,
            "invalid_request",
            "a job added to a batch has no callback_url of its own: the batch's is told "
            "when the batch ends",
        )
    batch_id = parse_id(spec.batch_id, "batch_id") if spec.batch_id else None
    item = replace(
        new_item(spec, stored, 0, spec.id or ""),
        priority=caller.priority(spec.priority, Priority.HIGH),
    )

    job = await run_in_threadpool(
        enqueue_job,
        sessions,
        dispatcher,
        item,
        caller,
        settings,
        client_key=spec.idempotency_key,
        batch_id=batch_id,
        callback_url=callback,
    )
    if job.created:
        SUBMITTED.labels("jobs").inc()
        TENANT_SUBMITTED.labels(caller.tenant or "").inc()
    return JobSubmitted(id=job.id, status=job.status, created=job.created)


@router.get(
    "",
    response_model=JobsPage,
    summary="Your jobs, newest first, a page at a time (filters: status, batch, created range)",
)
def list_jobs(
    caller: CallerDep,
    sessions: SessionsDep,
    after: After = None,
    limit: Limit = 50,
    status: Annotated[JobStatus | None, Query(description="only jobs in this status")] = None,
    batch_id: Annotated[uuid.UUID | None, Query(description="only this batch's jobs")] = None,
    created_from: CreatedFrom = None,
    created_to: CreatedTo = None,
) -> JobsPage:
    cut = window(caller, after, limit, created_from, created_to)
    with sessions() as session:
        batch = None if batch_id is None else owned_batch(session, batch_id.hex, caller).id
        jobs, cursor = jobs_page(session, cut, status=status, batch_id=batch)
        return JobsPage(data=[JobView.of(job) for job in jobs], next_cursor=cursor)


@router.get("/{job_id}", response_model=JobView, summary="A job: status, answer, timings")
def get_job(job_id: uuid.UUID, caller: CallerDep, sessions: SessionsDep) -> JobView:
    with sessions() as session:
        return JobView.of(owned_job(session, job_id.hex, caller))


@router.get(
    "/{job_id}/trace",
    summary="A job's agent trajectory (null if none), and the small model's zoom steps "
    "before the gate (speculation in depth; null if none)",
)
def get_trace(job_id: uuid.UUID, caller: CallerDep, sessions: SessionsDep) -> dict[str, Any]:
    with sessions() as session:
        job = owned_job(session, job_id.hex, caller)
        return {
            "id": job.id,
            "status": job.status,
            "trajectory": job.trajectory,
            "zoom_steps": job.zoom_steps,
        }


IMAGE_TYPES: dict[str, Any] = {"content": {"image/jpeg": {}, "image/png": {}, "image/webp": {}}}


@router.get(
    "/{job_id}/image",
    response_class=Response,
    responses={200: IMAGE_TYPES},
    summary="The job's image as the models saw it (EXIF-rotated), scaled to max_side",
)
def get_image(
    job_id: uuid.UUID,
    caller: CallerDep,
    settings: SettingsDep,
    sessions: SessionsDep,
    max_side: int | None = Query(None, ge=16, description="scale to fit this many pixels"),
) -> Response:
    with sessions() as session:
        job = owned_job(session, job_id.hex, caller)
    return image_response(job, settings, max_side=max_side)


@router.get(
    "/{job_id}/steps/{step}/crop",
    response_class=Response,
    responses={200: IMAGE_TYPES},
    summary="What an agent's zoom at this step cut from the image (DeepEyes); with "
    "small=true, the small model's zoom before the gate (speculation in depth)",
)
def get_crop(
    job_id: uuid.UUID,
    step: int,
    caller: CallerDep,
    settings: SettingsDep,
    sessions: SessionsDep,
    max_side: int | None = Query(None, ge=16),
    small: bool = Query(False, description="the small model's zoom step, not the agent's"),
) -> Response:
    with sessions() as session:
        job = owned_job(session, job_id.hex, caller)
    return image_response(job, settings, max_side=max_side, step=step, small=small)


@router.post(
    "/{job_id}/review",
    response_model=JobView,
    summary="Confirm or correct a finished job's answer (kept beside the model's, with "
    "the key's name and the time); again replaces the earlier review",
)
def review_job(
    job_id: uuid.UUID, spec: ReviewSpec, caller: CallerDep, sessions: SessionsDep
) -> JobView:
    with sessions.begin() as session:
        job = review(session, owned_job(session, job_id.hex, caller), spec, caller)
        session.flush()
        return JobView.of(job)


@router.post(
    "/{job_id}/cancel",
    response_model=JobView,
    summary="Cancel a job: one that waits is cancelled at once, one that runs stops at the "
    "end of its step (cancelling shows it). Again: nothing changes. A finished job: 409",
)
def cancel_job(job_id: uuid.UUID, caller: CallerDep, sessions: SessionsDep) -> JobView:
    with sessions.begin() as session:
        job = owned_job(session, job_id.hex, caller)
        cancel.cancel_job(session, job)
        session.refresh(job)
        return JobView.of(job)


@router.post(
    "/{job_id}/retry",
    response_model=JobView,
    summary="Run a failed or cancelled job again (its stage: where it stopped); anything "
    "else: 409 nothing_to_retry",
)
def retry_job(
    job_id: uuid.UUID,
    caller: CallerDep,
    sessions: SessionsDep,
    dispatcher: DispatcherDep,
    settings: SettingsDep,
) -> JobView:
    with sessions() as session:
        found = owned_job(session, job_id.hex, caller).id
    cancel.retry_job(sessions, dispatcher, found, quotas_of(caller, settings))
    with sessions() as session:
        return JobView.of(owned_job(session, found, caller))
