"""Every error answer has one shape: ``{"error": "<code>", "detail": "<what to do>"}``,
but under /openai/v1, which speaks OpenAI's (``openai_error_response``).

Routes raise ``ApiError`` (or let the domain's ``NotFound`` / ``IdempotencyConflict``
through); the handlers here turn those, FastAPI's validation errors and Starlette's own
HTTP errors into that shape, and count refusals (4xx) by code. An error nobody expected
is answered 500 in the same shape (its traceback goes to the log, never to the client).

Under /ui (the review pages, ``api.ui``) the same error is a page for a person: the
app's ``error_page`` renders it, with the same status.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from api.metrics import REFUSED
from common.errors import IdempotencyConflict, ImageError, InvalidInput, NotFound, SpecEyesError
from common.limits import OverLimit
from common.pipeline.cancel import AlreadyFinished, NothingToRetry
from common.store.reviews import NotReviewable


class ApiError(Exception):
    """An error answer: HTTP status, a stable code, and what to do about it."""

    def __init__(
        self, status: int, error: str, detail: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail
        self.headers = headers


# the domain's errors a route lets through, and the status each is answered with
DOMAIN_STATUS: dict[type[SpecEyesError], int] = {
    NotFound: 404,
    IdempotencyConflict: 409,
    NotReviewable: 409,
    AlreadyFinished: 409,
    NothingToRetry: 409,
    InvalidInput: 422,
}


def _domain_error(status: int) -> Callable[[Request, Exception], Awaitable[Response]]:
    async def handle(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, SpecEyesError)
        return answer(request, exc.code, exc.message, status)

    return handle


def install_handlers(app: FastAPI) -> None:
    """Answer every error in the one shape."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        return answer(request, exc.error, exc.detail, exc.status, exc.headers)

    for kind, status in DOMAIN_STATUS.items():  # (the most specific class answers)
        app.add_exception_handler(kind, _domain_error(status))

    @app.exception_handler(OverLimit)
    async def over_limit(request: Request, exc: OverLimit) -> Response:
        return answer(request, exc.setting, exc.message, 413)

    @app.exception_handler(ImageError)
    async def image_error(request: Request, exc: ImageError) -> Response:
        # an image the store points at that cannot be read now (moved, corrupt)
        return answer(request, exc.code or "image_unreadable", exc.message, 422)

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> Response:
        # Starlette logs the traceback; the client gets the one shape, never a trace
        return answer(request, "internal_error", "the server failed on this request", 500)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        return answer(request, "invalid_request", summary(exc.errors()), 422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        names = {404: "not_found", 405: "method_not_allowed"}
        return answer(
            request, names.get(exc.status_code, "http_error"), str(exc.detail), exc.status_code
        )


def answer(
    request: Request, error: str, detail: str, status: int, headers: dict[str, str] | None = None
) -> Response:
    """The error in the one shape, or, for a page under /ui, as a page."""
    page = getattr(request.app.state, "error_page", None)
    if page is not None and request.url.path.startswith("/ui"):
        if 400 <= status < 500:
            REFUSED.labels(error).inc()
        response: Response = page(request, error, detail, status, headers)
        return response
    if request.url.path.startswith("/openai/"):
        return openai_error_response(error, detail, status, headers)
    return error_response(error, detail, status, headers)


def error_response(
    error: str, detail: str, status: int, headers: dict[str, str] | None = None
) -> JSONResponse:
    if 400 <= status < 500:
        REFUSED.labels(error).inc()
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)


# OpenAI's error types by status (what its SDK reads into its exceptions)
_OPENAI_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}


def openai_error_response(
    error: str, detail: str, status: int, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The error in OpenAI's shape, for the compatible surface (``api.openai``): a request
    it cannot read is a 400 there, not our 422."""
    if 400 <= status < 500:
        REFUSED.labels(error).inc()
    status = 400 if status == 422 else status
    kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    body = {"error": {"message": detail, "type": kind, "param": None, "code": error}}
    return JSONResponse(body, status_code=status, headers=headers)


def summary(errors: Sequence[Any]) -> str:
    """Pydantic's validation errors in one line: ``field: message; ...`` (five at most)."""
    parts = []
    for error in errors[:5]:
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        parts.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
    return "; ".join(parts)
