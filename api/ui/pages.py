"""The review pages' routes: sign-in, the batches, a batch, its results, its export, its
review queue, cancel and resume; and what every page shares (the signed-in session, a
``Listing`` and its grid). A single job's pages and the jobs sent alone:
``api.ui.job_pages``. Each reads through ``api.browse`` and the store's read models, as
/v1 does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Form, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse, StreamingResponse
from sqlalchemy.orm import Session

from api.browse import (
    THUMBNAIL_SIDE,
    owned_batch,
    result_filter,
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
from common.config import Settings
from common.errors import InvalidInput
from common.pipeline import cancel
from common.pipeline.audit import figures_of
from common.store import reads, reviews
from common.store.analytics import REFERENCE_COUNTS, STRICT_COUNTS
from common.store.browse import BadCursor, Rows, results_page
from common.store.export import result_row
from common.store.keys import check_key
from common.store.listing import Window, batches_page
from common.store.overview import kept_overview, overview, overview_or_soon
from common.store.tables import Batch

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
    response = RedirectResponse(local(next), status_code=303)
    start_session(response, request, signer(request), row)
    return response


def _signin_page(request: Request, settings: Any, next: str, failed: str | None = None) -> Response:
    nonce = signin_nonce(request)
    html = render(
        "signin.html",
        request,
        None,
        token=signer(request).mac("signin", nonce),
        next=local(next),
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
        counts = context["counts"]
        # (a large batch's made by a thread: the page answers now)
        found = overview_or_soon(sessions, session, batch.id, counts)
        failures = sorted(counts.failures)
        grid = grid_of(session, Listing.of_batch(batch), {}, None, failures)
        html = render(
            "batch.html",
            request,
            ui,
            overview=found,
            counting={"strict": STRICT_COUNTS, "reference": REFERENCE_COUNTS},
            usage=found.usage.to_dict(settings.accounting.price_per_gpu_hour) if found else None,
            bars=views.histogram_bars(found.histogram) if found else [],
            tau_x=views.threshold_x(found.histogram.threshold) if found else None,
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
        grid = grid_of(session, Listing.of_batch(batch), dict(request.query_params), after, reasons)
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


def grid_of(
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


def local(target: str) -> str:
    """Only a path of these pages: never another site (an open redirect)."""
    if target.startswith("/ui") and not target.startswith("//") and "\\" not in target:
        return target
    return "/ui/batches"
