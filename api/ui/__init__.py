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
from urllib.parse import quote

from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint

from api.ui import pages
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


class PageHeaders(BaseHTTPMiddleware):
    """The security headers of every /ui answer."""

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await call_next(request)
        if request.url.path.startswith("/ui"):
            response.headers["Content-Security-Policy"] = CSP
            response.headers["X-Content-Type-Options"] = "nosniff"
            response.headers["X-Frame-Options"] = "DENY"
            response.headers["Referrer-Policy"] = "same-origin"
        return response


def install(app: FastAPI, settings: Settings) -> None:
    """Add the pages, their assets, their headers and their error page to ``app``."""
    app.state.signer = Signer(settings)
    app.state.error_page = error_page
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="ui-static")
    app.include_router(pages.router)
    app.add_middleware(PageHeaders)


def error_page(
    request: Request, error: str, detail: str, status: int, headers: dict[str, str] | None
) -> Response:
    """An error under /ui as a page (``api.errors``); not signed in: to the sign-in page."""
    if error == "signin_required":
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/ui/signin?next={quote(target, safe='/')}", status_code=303)
    html = render("error.html", request, None, error=error, detail=detail, status=status)
    return HTMLResponse(html, status_code=status, headers=headers)
