"""``speceyes serve``: the HTTP API (and, without a broker, the embedded runner)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys

import uvicorn

from api.app import create_app
from cli.compose import make_dispatcher
from cli.options import add_pipeline_flags, add_settings, require_shared_store, settings_from_args
from common.config import without_password
from common.errors import ConfigurationError
from common.logs import log_service
from common.store.db import open_store

# An idle connection is kept this long (uvicorn's own default: 5 s). Clients drop theirs
# sooner (httpx and the openai SDK after 5 s, load balancers after 60 s), so the server
# never closes one that a client is just reusing for a request: that race answered a
# POST with a reset connection under load (tests/api/test_live_server.py, CI 2026-12-04).
KEEP_ALIVE_S = 75

DESCRIPTION = """\
Serve the HTTP API (OpenAPI docs at /docs). Jobs submitted to it are committed to the
job store and sent to the fast queue of the broker (--broker / SPECEYES_BROKER_URL),
where `speceyes worker fast|slow` processes run them. Without a broker, this process
also runs the embedded runner, so the API works on one machine with SQLite.

Every /v1 route needs an API key: create one with `speceyes keys create NAME` (same
--db). Limits (upload bytes, image pixels, question length, options, batch size) and
the folders jobs may name by server path are settings: see `speceyes config`.

It logs one line per request (method, route, status, ms, the key's name, the client)
and one per job that fails, on stderr, as text or JSON lines (--log-format json).
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_settings(parser, "api.host", "api.port", "api.log_format")
    add_pipeline_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    log_service(settings.api.log_format)
    _check_port(settings.api.host, settings.api.port)
    require_shared_store(settings)
    sessions = open_store(settings.database_url)
    try:
        dispatcher = make_dispatcher(settings, sessions)  # a model that cannot be had: refused
    except BaseException:
        sessions.discard_if_unused()
        raise
    app = create_app(settings, sessions=sessions, dispatcher=dispatcher)
    broker = settings.broker.url
    mode = f"broker {without_password(broker)}" if broker else "embedded runner"
    base = f"http://{settings.api.host}:{settings.api.port}"
    print(f"serving on {base} ({mode}); API docs at {base}/docs, review pages at {base}/ui")
    print(f"job store: {sessions.described}")
    # uvicorn shuts down in order on SIGTERM as on Ctrl-C, then raises the signal again
    # for whatever handler was there before it: by default, death before the store is
    # closed (SQLite's -wal and -shm left behind). This one lets the run end here.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        uvicorn.run(
            app,
            host=settings.api.host,
            port=settings.api.port,
            log_level="warning",
            timeout_keep_alive=KEEP_ALIVE_S,
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
    sessions.close()
    if "torch" in sys.modules:
        # The shutdown ended the embedded runner's threads in order (its close()); after a
        # generation cut short, Python's own teardown can still abort in torch's (as after
        # an interrupted annotate). Everything is committed: leave as a clean stop does.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _check_port(host: str, port: int) -> None:
    """A port another process holds is one clear line, before anything loads."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigurationError(
                f"cannot listen on {host}:{port} ({exc.strerror}): another process holds it, "
                "or the address is not this machine's; choose --port / --host"
            ) from None
