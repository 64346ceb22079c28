"""The review pages' routes: sign-in, batches, a batch, its results, a job, the review
queue; and the same grid and queue over the jobs a caller sent alone (``/ui/alone``).
Each reads through ``api.browse`` and the store's read models, as /v1 does."""

from __future__ import annotations

import contextlib
import io
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Form, Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse, StreamingResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.browse import (
    PREVIEW_SIDE,
    THUMBNAIL_SIDE,
    ReviewSpec,
    image_response,
    owned_batch,
    owned_job,
    result_filter,
    review,
)
from api.deps import DispatcherDep, Limiters, SessionsDep, SettingsDep, too_many
from api.errors import ApiError
from api.intake import public_path
from api.ui import views
from api.ui.render import render
from api.ui.session import (
    Signer,
    UiSession,
    check_csrf,
    check_signin_token,
    current_session,
    end_session,
    remember_signin,
    signin_nonce,
    start_session,
)
from common.config import ImageSettings, Settings
from common.contracts import JobStatus
from common.errors import ImageError, InvalidInput
from common.images import image_size
from common.pipeline import cancel
from common.pipeline.audit import figures_of
from common.sources.locations import is_local_file
from common.sources.reading import read_located
from common.store import reads, reviews
from common.store.browse import BadCursor, Rows, kept_overview, overview, results_page
from common.store.export import result_row
from common.store.keys import check_key
from common.store.listing import Window, batches_page, jobs_page
from common.store.tables import Batch, BatchItem, Job

router = APIRouter(prefix="/ui", include_in_schema=False)


def signer(request: Request) -> Signer:
    value: Signer = request.app.state.signer
    return value


def ui_session(request: Request, sessions: SessionsDep, settings: SettingsDep) -> UiSession:
    """The signed-in browser, or a redirect to the sign-in page (``api.ui.error_page``)."""
    with sessions() as session:
        found = current_session(request, session, signer(request), settings)
    if found is None:
        raise ApiError(401, "signin_required", "sign in with an API key first")
    request.state.key_name = found.caller.name  # for the access log, as /v1 does
    limiters: Limiters = request.app.state.limiters
    if found.key_id and (wait := limiters.requests.take(found.key_id)):
        raise too_many(
            "rate_limited",
            f"over {settings.api.rate_per_s:g} requests/s for this key (api_rate_per_s)",
            wait,
        )
    return found


UiDep = Annotated[UiSession, Depends(ui_session)]
LISTED_SCORING_JOBS = 20_000  # the batches page scores a batch this large, not larger
ALONE = "/ui/alone"  # the grid and review queue of the jobs sent alone (its routes: /alone)


@dataclass(frozen=True)
class Listing:
    """What a grid or a review queue lists, as its pages name and link it: a batch, or
    the jobs a caller sent alone."""

    name: str
    home: str  # its own page
    path: str  # where its results and review pages hang
    job_query: str  # what a job's link carries, so the job page shows the row it is
    rows: Rows

    @classmethod
    def of_batch(cls, batch: Batch) -> Listing:
        home = f"/ui/batches/{batch.id}"
        return cls(batch.name, home, home, f"?batch={batch.id}", Rows.of_batch(batch.id))

    @classmethod
    def alone(cls, ui: UiSession) -> Listing:
        rows = Rows.alone(ui.caller.tenant, everyone=ui.caller.admin)
        return cls("jobs sent alone", "/ui/jobs", ALONE, "", rows)


def page(html: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})


@router.get("")
@router.get("/")
def home() -> RedirectResponse:
    return RedirectResponse("/ui/batches", status_code=303)


@router.get("/signin")
def signin_form(request: Request, settings: SettingsDep, next: str = "/ui/batches") -> Response:
    return _signin_page(request, settings, next)


@router.post("/signin")
def signin(
    request: Request,
    settings: SettingsDep,
    sessions: SessionsDep,
    key: Annotated[str, Form()] = "",
    csrf: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = "/ui/batches",
) -> Response:
    """A session for a live key; a wrong one is counted as the API counts it."""
    check_signin_token(request, signer(request), csrf)
    limiters: Limiters = request.app.state.limiters
    address = request.client.host if request.client else "unknown"
    if limiters.auth_failures.wait_s(address):
        raise ApiError(429, "auth_failures", "too many failed sign-ins from here: wait a minute")
    with sessions() as session:
        row = check_key(session, key.strip()) if key.strip() else None
    if row is None and settings.api.require_keys:
        limiters.auth_failures.take(address)
        return _signin_page(request, settings, next, failed="unknown or revoked API key")
    response = RedirectResponse(_local(next), status_code=303)
    start_session(response, request, signer(request), row)
    return response


def _signin_page(request: Request, settings: Any, next: str, failed: str | None = None) -> Response:
    nonce = signin_nonce(request)
    html = render(
        "signin.html",
        request,
        None,
        token=signer(request).mac("signin", nonce),
        next=_local(next),
        keys_off=not settings.api.require_keys,
        failed=failed,
    )
    response = page(html, 401 if failed else 200)
    remember_signin(response, request, nonce)
    return response


@router.post("/signout")
def signout(ui: UiDep, csrf: Annotated[str, Form()] = "") -> Response:
    check_csrf(ui, csrf)
    response = RedirectResponse("/ui/signin", status_code=303)
    end_session(response)
    return response


@router.get("/batches")
def batches(request: Request, ui: UiDep, sessions: SessionsDep) -> Response:
    window = Window(ui.caller.tenant, everyone=ui.caller.admin, limit=100)
    with sessions() as session:
        lines = []
        for line in batches_page(session, window)[0]:
            counts = reads.batch_counts(session, line.batch.id)
            # scoring a large batch is its own page's work: here only if it is kept
            large = counts.jobs > LISTED_SCORING_JOBS
            if large:
                found = kept_overview(session, line.batch.id, counts)
            else:
                found = overview(session, line.batch.id, counts)
            accuracy = found.correct / found.scored if found and found.scored else None
            lines.append(
                {
                    "line": line,
                    "counts": counts,
                    "accuracy": accuracy,
                    "unscored": large and not found,
                }
            )
        return page(render("batches.html", request, ui, lines=lines))


@router.get("/batches/{batch_id}")
def batch_page(
    batch_id: str, request: Request, ui: UiDep, sessions: SessionsDep, settings: SettingsDep
) -> Response:
    with sessions() as session:
        batch = owned_batch(session, batch_id, ui.caller)
        context = _progress(session, batch, settings)
        found = overview(session, batch.id, context["counts"])
        grid = _grid(session, Listing.of_batch(batch), {}, None, sorted(context["counts"].failures))
        html = render(
            "batch.html",
            request,
            ui,
            overview=found,
            bars=views.histogram_bars(found.histogram),
            tau_x=views.threshold_x(found.histogram.threshold),
            chart=(views.CHART_W, views.CHART_H),
            **context,
            **grid,
        )
        return page(html)


@router.get("/batches/{batch_id}/progress")
def batch_progress(
    batch_id: str, request: Request, ui: UiDep, sessions: SessionsDep, settings: SettingsDep
) -> Response:
    """The batch page's live part, fetched again while the batch runs."""
    with sessions() as session:
        batch = owned_batch(session, batch_id, ui.caller)
        html = render("progress.html", request, ui, **_progress(session, batch, settings))
        return page(html)


@router.get("/batches/{batch_id}/results")
def batch_results(
    batch_id: str, request: Request, ui: UiDep, sessions: SessionsDep, after: str | None = None
) -> Response:
    with sessions() as session:
        batch = owned_batch(session, batch_id, ui.caller)
        reasons = reads.failure_codes(session, batch.id)
        grid = _grid(session, Listing.of_batch(batch), dict(request.query_params), after, reasons)
        return page(render("results.html", request, ui, **grid))


@router.get("/batches/{batch_id}/export.jsonl")
def batch_export(
    batch_id: str, ui: UiDep, sessions: SessionsDep, settings: SettingsDep
) -> StreamingResponse:
    """The batch's rows as ``speceyes export`` writes them (reviews included)."""
    with sessions() as session:
        batch = owned_batch(session, batch_id, ui.caller)
    uploads = settings.api.upload_dir.resolve()

    def rows() -> Iterator[bytes]:
        with sessions() as session:
            for item, job in reads.batch_results(session, batch.id):
                row = {**result_row(item, job), "image": public_path(job.image_path, uploads)}
                yield (json.dumps(row, ensure_ascii=False) + "\n").encode()

    filename = f"batch-{batch.id}.jsonl"
    headers = {"Content-Disposition": f'attachment; filename="{filename}"'}
    return StreamingResponse(rows(), media_type="application/x-ndjson", headers=headers)


@router.get("/batches/{batch_id}/review")
def review_queue(
    batch_id: str, request: Request, ui: UiDep, sessions: SessionsDep, limit: int = 20
) -> Response:
    with sessions() as session:
        batch = owned_batch(session, batch_id, ui.caller)
        entries = reviews.review_queue(session, batch.id, limit=max(1, min(limit, 100)))
        listing = Listing.of_batch(batch)
        return page(render("review.html", request, ui, listing=listing, entries=entries))


@router.get("/alone/results")
def alone_results(
    request: Request, ui: UiDep, sessions: SessionsDep, after: str | None = None
) -> Response:
    """The jobs the caller sent alone, in the grid and with the filters of a batch."""
    listing = Listing.alone(ui)
    with sessions() as session:
        reasons = listing.rows.failure_codes(session)
        grid = _grid(session, listing, dict(request.query_params), after, reasons)
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
    job_id: str, step: int, ui: UiDep, sessions: SessionsDep, settings: SettingsDep
) -> Response:
    with sessions() as session:
        job = owned_job(session, job_id, ui.caller)
    return image_response(job, settings, max_side=PREVIEW_SIDE // 2, step=step)


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
    return RedirectResponse(_local(next or f"/ui/jobs/{job_id}"), status_code=303)


@router.post("/batches/{batch_id}/cancel")
def batch_cancel(
    batch_id: str, ui: UiDep, sessions: SessionsDep, csrf: Annotated[str, Form()] = ""
) -> Response:
    """Cancel what of the batch has not finished (``common.pipeline.cancel``)."""
    check_csrf(ui, csrf)
    with sessions.begin() as session:
        found = owned_batch(session, batch_id, ui.caller).id
        cancel.cancel_batch(session, found)
    return RedirectResponse(f"/ui/batches/{found}", status_code=303)


@router.post("/batches/{batch_id}/resume")
def batch_resume(
    batch_id: str,
    ui: UiDep,
    sessions: SessionsDep,
    dispatcher: DispatcherDep,
    csrf: Annotated[str, Form()] = "",
) -> Response:
    """Take a cancelled batch up again."""
    check_csrf(ui, csrf)
    with sessions() as session:
        found = owned_batch(session, batch_id, ui.caller).id
    cancel.resume_batch(sessions, dispatcher, found)
    return RedirectResponse(f"/ui/batches/{found}", status_code=303)


def _progress(session: Session, batch: Batch, settings: Settings) -> dict[str, Any]:
    counts = reads.batch_counts(session, batch.id)  # one pass: counts, pace, audit
    return {
        "batch": batch,
        "counts": counts,
        "funnel": views.funnel(counts),
        "pace": counts.pace,
        "audit": figures_of(counts.audited, counts.audit_agreed, settings),
        "running": counts.finished < counts.jobs,
    }


def _grid(
    session: Session,
    listing: Listing,
    params: dict[str, str],
    after: str | None,
    reasons: list[str],
) -> dict[str, Any]:
    filters = {k: v for k, v in params.items() if k not in ("after",) and v}
    wanted = result_filter(filters)
    try:
        found = results_page(session, listing.rows, wanted, after=after)
    except BadCursor as exc:
        raise InvalidInput(str(exc), code="bad_cursor") from None
    next_url = None
    if found.next_cursor:
        next_url = f"{listing.path}/results?" + urlencode({**filters, "after": found.next_cursor})
    return {
        "listing": listing,
        "rows": found.rows,
        "filters": filters,
        "wanted": wanted,
        "next_url": next_url,
        "reasons": reasons,
        "thumb_side": THUMBNAIL_SIDE,
    }


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


def _local(target: str) -> str:
    """Only a path of these pages: never another site (an open redirect)."""
    if target.startswith("/ui") and not target.startswith("//") and "\\" not in target:
        return target
    return "/ui/batches"
