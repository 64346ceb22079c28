"""An app served for real (uvicorn, in a thread of the test's process) on a port the
kernel picks as it binds: what a browser test points Chromium at."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from tests.helpers.waiting import wait_until


@contextmanager
def live_app(app: FastAPI) -> Iterator[str]:
    """Serve ``app``; yields its base URL; stops it (its shutdown runs) afterwards."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))  # bound here: no other process can take the port
    listener.listen()
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, deadline_s=30, what="the app to start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        listener.close()
