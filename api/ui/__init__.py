"""The review pages, served by ``speceyes serve`` under /ui beside the API.

A person signs in with an API key (``api.ui.session``) and sees what that key's tenant
may read (an admin key: everything): the batches, a batch's funnel and results, a job
with its image, gate and trajectory; and corrects answers (``common.store.reviews``).
The pages are HTML rendered here (Jinja2, every value escaped) with a little JavaScript
(``static/ui.js``) that only makes them nicer: progress without a reload, a keyboard
review queue, a zoomable image. Every asset ships in the package: nothing is fetched
from elsewhere.

Each page reads through the same functions as its /v1 twin (``api.browse`` and the
store's read models), never a second path. Every /ui answer carries a
Content-Security-Policy with ``script-src 'self'`` (so no inline script runs, an
injected one least of all), ``nosniff`` and a refusal to be framed.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote, urlsplit

from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint

from api.ui import job_pages, pages
from api.ui.render import render
from api.ui.session import Signer
from common.config import Settings

HERE = Path(__file__).parent
CSP = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",  # Thyme's thumbnails are PNG data URLs we encoded
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)


SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}


class PageHeaders(BaseHTTPMiddleware):
    """The security headers of every /ui answer (an error page sets its own: a failure
    nobody expected is answered outside this middleware)."""

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await call_next(request)
        if request.url.path.startswith("/ui"):
            response.headers.update(SECURITY_HEADERS)
        return response


def install(app: FastAPI, settings: Settings) -> None:
    """Add the pages, their assets, their headers and their error page to ``app``."""
    app.state.signer = Signer(settings)
    app.state.error_page = error_page
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="ui-static")
    app.include_router(pages.router)
    app.include_router(job_pages.router)
    app.add_middleware(PageHeaders)


def error_page(
    request: Request, error: str, detail: str, status: int, headers: dict[str, str] | None
) -> Response:
    """An error under /ui as a page (``api.errors``); for the review queue's script (it
    asks for JSON), the API's one shape; not signed in: to the sign-in page, and back to
    the page that was open."""
    secured = {**(headers or {}), **SECURITY_HEADERS, "Vary": "Accept"}
    if "application/json" in request.headers.get("accept", ""):
        return JSONResponse({"error": error, "detail": detail}, status, headers=secured)
    if error == "signin_required":
        target = _back_to(request)
        return RedirectResponse(f"/ui/signin?next={quote(target, safe='/')}", status_code=303)
    html = render("error.html", request, None, error=error, detail=detail, status=status)
    return HTMLResponse(html, status_code=status, headers=secured)


def _back_to(request: Request) -> str:
    """Where a signed-out browser returns once signed in: the page it asked for, or, for
    a form it sent (not a page to open), the page the form was on."""
    if request.method == "GET":
        return request.url.path + (f"?{request.url.query}" if request.url.query else "")
    referer = urlsplit(request.headers.get("referer", ""))
    same_site = referer.netloc == request.url.netloc and referer.path.startswith("/ui")
    return referer.path if same_site else "/ui/batches"
