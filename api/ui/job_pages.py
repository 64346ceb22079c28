"""The review pages of single jobs: the jobs list, a job's page (its image, zooms and
trace) and its review, and the jobs a caller sent alone in a batch's grid and review
queue (``/ui/alone``). The pages of batches, and what both share: ``api.ui.pages``."""

from __future__ import annotations

import contextlib
import io
import json
import uuid
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Query, Request, Response
from fastapi.responses import RedirectResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.browse import PREVIEW_SIDE, ReviewSpec, image_response, owned_job, review
from api.deps import SessionsDep, SettingsDep
from api.ui import views
from api.ui.pages import Listing, UiDep, grid_of, local, page
from api.ui.render import render
from api.ui.session import check_csrf
from common.config import ImageSettings
from common.contracts import JobStatus
from common.errors import ImageError, InvalidInput
from common.images import image_size
from common.sources.locations import is_local_file
from common.sources.reading import read_located
from common.store import reviews
from common.store.listing import Window, jobs_page
from common.store.tables import BatchItem, Job

router = APIRouter(prefix="/ui", include_in_schema=False)


@router.get("/alone/results")
def alone_results(
    request: Request, ui: UiDep, sessions: SessionsDep, after: str | None = None
) -> Response:
    """The jobs the caller sent alone, in the grid and with the filters of a batch."""
    listing = Listing.alone(ui)
    with sessions() as session:
        reasons = listing.rows.failure_codes(session)
        grid = grid_of(session, listing, dict(request.query_params), after, reasons)
        return page(render("results.html", request, ui, **grid))


@router.get("/alone/review")
def alone_review_queue(
    request: Request, ui: UiDep, sessions: SessionsDep, limit: int = 20
) -> Response:
    """The review queue of the jobs the caller sent alone, as a batch's."""
    listing = Listing.alone(ui)
    with sessions() as session:
        entries = reviews.review_queue(session, listing.rows, limit=max(1, min(limit, 100)))
        return page(render("review.html", request, ui, listing=listing, entries=entries))


@router.get("/jobs")
def jobs(
    request: Request,
    ui: UiDep,
    sessions: SessionsDep,
    status: str | None = None,
    after: str | None = None,
) -> Response:
    """The caller's newest jobs, those sent one by one among them (the store function GET
    /v1/jobs reads), a page at a time."""
    statuses = [value.value for value in JobStatus]
    wanted = status or None
    if wanted is not None and wanted not in statuses:
        raise InvalidInput(f"status={wanted[:40]!r}: choose one of {', '.join(statuses)}")
    window = Window(ui.caller.tenant, everyone=ui.caller.admin, after=after or None, limit=50)
    with sessions() as session:
        found, cursor = jobs_page(session, window, status=wanted)
        query = urlencode({"after": cursor, **({"status": wanted} if wanted else {})})
        html = render(
            "jobs.html",
            request,
            ui,
            jobs=found,
            statuses=statuses,
            status=wanted,
            after=after,
            next_cursor=cursor,
            next_query=query,
        )
        return page(html)


@router.get("/jobs/{job_id}")
def job_page(
    job_id: str,
    request: Request,
    ui: UiDep,
    sessions: SessionsDep,
    settings: SettingsDep,
    batch: str | None = None,
) -> Response:
    with sessions() as session:
        job = owned_job(session, job_id, ui.caller)
        item = _item_of(session, job, batch)
        size = _size(job, settings.images.exif_rotate)
        html = render(
            "job.html",
            request,
            ui,
            job=job,
            item=item,
            size=size,
            preview_side=PREVIEW_SIDE,
            steps=job.trace_steps or [],
            trajectory_error=_trajectory_error(job),
            zooms=views.zooms(job),
            small_steps=job.small_steps or [],
            small_zooms=views.zooms(job, small=True),
            produced=views.produced_images,
            tokens=views.token_bars(job),
            threshold=job.gate_threshold,
            phases=views.phases(job),
            verdicts=views.verdicts(item, job),
            letters=[chr(ord("A") + index) for index in range(len(job.options or []))],
        )
        return page(html)


@router.get("/jobs/{job_id}/image")
def job_image(
    job_id: str,
    ui: UiDep,
    sessions: SessionsDep,
    settings: SettingsDep,
    max_side: int | None = Query(None, ge=16),
) -> Response:
    with sessions() as session:
        job = owned_job(session, job_id, ui.caller)
    return image_response(job, settings, max_side=max_side)


@router.get("/jobs/{job_id}/steps/{step}/crop")
def job_crop(
    job_id: str,
    step: int,
    ui: UiDep,
    sessions: SessionsDep,
    settings: SettingsDep,
    small: bool = False,
) -> Response:
    """What the agent's zoom at ``step`` cut (``small``: the small model's, before the
    gate)."""
    with sessions() as session:
        job = owned_job(session, job_id, ui.caller)
    return image_response(job, settings, max_side=PREVIEW_SIDE // 2, step=step, small=small)


@router.post("/jobs/{job_id}/review")
def job_review(
    job_id: str,
    request: Request,
    ui: UiDep,
    sessions: SessionsDep,
    answer: Annotated[str, Form()] = "",
    pick: Annotated[str, Form()] = "",
    csrf: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = "",
) -> Response:
    """Record a review (a picked option wins over the text); a form goes on to ``next``
    (else the job), a script gets JSON."""
    check_csrf(ui, csrf)
    spec = ReviewSpec(answer=pick or answer)
    with sessions.begin() as session:
        job = review(session, owned_job(session, job_id, ui.caller), spec, ui.caller)
        final = job.given_answer
    if "application/json" in request.headers.get("accept", ""):
        return Response(
            json.dumps({"job_id": job_id, "final_answer": final, "reviewer": ui.caller.name}),
            media_type="application/json",
        )
    return RedirectResponse(local(next or f"/ui/jobs/{job_id}"), status_code=303)


def _trajectory_error(job: Job) -> str | None:
    trace = job.trajectory if isinstance(job.trajectory, dict) else {}
    parts = [str(trace[name]) for name in ("error_code", "error") if trace.get(name)]
    return ": ".join(parts) or None


def _item_of(session: Session, job: Job, batch_id: str | None) -> BatchItem | None:
    """The row of ``batch_id`` that asked this job (else the job's first row)."""
    query = select(BatchItem).where(BatchItem.job_id == job.id)
    if batch_id:
        with contextlib.suppress(ValueError):
            query = query.where(BatchItem.batch_id == uuid.UUID(batch_id).hex)
    row: BatchItem | None = session.scalars(query.order_by(BatchItem.position).limit(1)).first()
    return row


def _size(job: Job, rotate: bool) -> tuple[int, int] | None:
    if not job.image_path:
        return None
    try:
        if is_local_file(job.image_path):
            return image_size(job.image_path, rotate=rotate)
        data = read_located(job.image_path, ImageSettings())
        return image_size(io.BytesIO(data), rotate=rotate)
    except ImageError:
        return None
