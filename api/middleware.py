"""The request-size limit, counted on the bytes that arrive, not on what the client declares.

A body with a ``Content-Length`` over ``max_request_bytes`` is refused before it is read.
A body without one (chunked) or one that lies is counted as it streams in: the read that
crosses the limit raises ``ApiError(413)``, which the error handlers answer in the one
shape, so no more than the limit (and one chunk) is ever held in memory.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import ApiError, error_response, openai_error_response

CODE = "max_request_bytes"


class BodyLimit:
    """ASGI middleware: no request body over ``limit`` bytes."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            refusal = self._detail(f"the request has {int(declared)} bytes")
            openai = scope.get("path", "").startswith("/openai/")  # (its own error shape)
            shaped = openai_error_response if openai else error_response
            await shaped(CODE, refusal, 413)(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise ApiError(413, CODE, self._detail(f"the request is over {received} bytes"))
            return message

        await self.app(scope, counted, send)

    def _detail(self, what: str) -> str:
        return f"{what}; the limit (max_request_bytes) is {self.limit}"
