"""Every error answer has one shape: ``{"error": "<code>", "detail": "<what to do>"}``.

Routes raise ``ApiError`` (or let the domain's ``NotFound`` / ``IdempotencyConflict``
through); the handlers here turn those, FastAPI's validation errors and Starlette's own
HTTP errors into that shape, and count refusals (4xx) by code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from api.metrics import REFUSED
from common.errors import IdempotencyConflict, NotFound


class ApiError(Exception):
    """An error answer: HTTP status, a stable code, and what to do about it."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail


def install_handlers(app: FastAPI) -> None:
    """Answer every error in the one shape."""

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.error, exc.detail, exc.status)

    @app.exception_handler(NotFound)
    async def not_found(_: Request, exc: NotFound) -> JSONResponse:
        return error_response(exc.code, exc.message, 404)

    @app.exception_handler(IdempotencyConflict)
    async def conflict(_: Request, exc: IdempotencyConflict) -> JSONResponse:
        return error_response(exc.code, exc.message, 409)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response("invalid_request", summary(exc.errors()), 422)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        names = {404: "not_found", 405: "method_not_allowed"}
        return error_response(
            names.get(exc.status_code, "http_error"), str(exc.detail), exc.status_code
        )


def error_response(error: str, detail: str, status: int) -> JSONResponse:
    if 400 <= status < 500:
        REFUSED.labels(error).inc()
    return JSONResponse({"error": error, "detail": detail}, status_code=status)


def summary(errors: Sequence[Any]) -> str:
    """Pydantic's validation errors in one line: ``field: message; ...`` (five at most)."""
    parts = []
    for error in errors[:5]:
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        parts.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
    return "; ".join(parts)
