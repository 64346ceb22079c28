"""One log line per request (``speceyes.access``, ``common.logs``): method, the route's
template (``/v1/jobs/{job_id}``, never the raw path with its ids), status, milliseconds,
the name of the key that called (``require_key`` puts it in the request's state; never
the secret) and the client's address. A request that raised is logged as its 500.
Every answer says how long the server took to start it (``Server-Timing: app;dur=MS``)."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common.logs import ACCESS


class AccessLog:
    """ASGI middleware, outermost: it times the whole request, limits included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                # the server's time to the answer's start, for a browser's timing panel
                # and for `speceyes bench ui` (not the client's: no network in it)
                took = (time.perf_counter() - started) * 1000
                headers = list(message.get("headers", []))
                headers.append((b"server-timing", f"app;dur={took:.1f}".encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, sent)
        finally:
            client = scope.get("client")
            fields = {
                "method": scope["method"],
                "route": route_template(scope),
                "status": status,
                "ms": round((time.perf_counter() - started) * 1000, 1),
                "key": scope.get("state", {}).get("key_name") or "-",
                "client": client[0] if client else "-",
            }
            ACCESS.info("request", extra={"fields": fields})


def route_template(scope: Scope) -> str:
    """The matched route's template with the prefixes it was included under: the route
    knows its own part (``/jobs/{job_id}``), the path's leading segments are the rest."""
    route = scope.get("route")
    own = getattr(route, "path_format", None)
    if own is None:
        return "(no route)"
    segments = scope["path"].split("/")
    prefix = "/".join(segments[: len(segments) - own.count("/")])
    return prefix + own
