"""Every error answer has one shape: ``{"error": "<code>", "detail": "<what to do>"}``.

Routes raise ``ApiError`` (or let the domain's ``NotFound`` / ``IdempotencyConflict``
through); the handlers here turn those, FastAPI's validation errors and Starlette's own
HTTP errors into that shape, and count refusals (4xx) by code. An error nobody expected
is answered 500 in the same shape (its traceback goes to the log, never to the client).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from api.metrics import REFUSED
from common.errors import IdempotencyConflict, InvalidInput, NotFound
from common.limits import OverLimit


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


def install_handlers(app: FastAPI) -> None:
    """Answer every error in the one shape."""

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.error, exc.detail, exc.status, exc.headers)

    @app.exception_handler(NotFound)
    async def not_found(_: Request, exc: NotFound) -> JSONResponse:
        return error_response(exc.code, exc.message, 404)

    @app.exception_handler(IdempotencyConflict)
    async def conflict(_: Request, exc: IdempotencyConflict) -> JSONResponse:
        return error_response(exc.code, exc.message, 409)

    @app.exception_handler(OverLimit)
    async def over_limit(_: Request, exc: OverLimit) -> JSONResponse:
        return error_response(exc.setting, exc.message, 413)

    @app.exception_handler(InvalidInput)
    async def invalid_input(_: Request, exc: InvalidInput) -> JSONResponse:
        return error_response(exc.code, exc.message, 422)

    @app.exception_handler(Exception)
    async def internal(_: Request, exc: Exception) -> JSONResponse:
        # Starlette logs the traceback; the client gets the one shape, never a trace
        return error_response("internal_error", "the server failed on this request", 500)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response("invalid_request", summary(exc.errors()), 422)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        names = {404: "not_found", 405: "method_not_allowed"}
        return error_response(
            names.get(exc.status_code, "http_error"), str(exc.detail), exc.status_code
        )


def error_response(
    error: str, detail: str, status: int, headers: dict[str, str] | None = None
) -> JSONResponse:
    if 400 <= status < 500:
        REFUSED.labels(error).inc()
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)


def summary(errors: Sequence[Any]) -> str:
    """Pydantic's validation errors in one line: ``field: message; ...`` (five at most)."""
    parts = []
    for error in errors[:5]:
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        parts.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
    return "; ".join(parts)
