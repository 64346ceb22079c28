"""A real webhook receiver on 127.0.0.1: down until told to come up, then answering each
request as its script says (a status, a redirect, an answer held past the sender's time
limit, one trickled a header line at a time, a 503 with a Retry-After, or 204), keeping
every request it was sent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    server: ThreadingHTTPServer
    script: list[tuple[str, float | int | str]] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    released: threading.Event = field(default_factory=threading.Event)
    up: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def start(self) -> None:
        """Come up: connections were refused until now (the port bound, not listening)."""
        self.server.server_activate()
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.up = True

    def next_answer(self) -> tuple[str, float | int | str]:
        return self.script.pop(0) if self.script else ("status", 204)


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            body = self.rfile.read(length)
            receiver.received.append(Received(self.path, dict(self.headers.items()), body))
            kind, value = receiver.next_answer()
            if kind == "trickle":  # a header line every 0.1 s, for ``value`` seconds
                self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                for line in range(int(float(value) * 10)):
                    if receiver.released.wait(0.1):
                        return
                    self.wfile.write(f"X-Slow-{line}: 1\r\n".encode())
                    self.wfile.flush()
                return
            if kind == "retry_after":  # 503, asking to be tried again after ``value``
                self.send_response(503)
                self.send_header("retry-after", str(value))
                self.send_header("content-length", "0")
                self.end_headers()
                return
            if kind == "hold":  # answer only after the sender gave up on it (or at the end)
                receiver.released.wait(float(value))
                kind, value = "status", 204
            self.send_response(int(value) if kind == "status" else 302)
            if kind == "redirect":
                self.send_header("location", str(value))
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"no" if kind != "status" or int(value) >= 300 else b"ok")

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@contextmanager
def receiver(*, up: bool = True) -> Iterator[Receiver]:
    """A receiver (``up=False``: refusing connections until ``start()``)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler, bind_and_activate=False)
    server.daemon_threads = True
    server.server_bind()
    made = Receiver(server)
    server.RequestHandlerClass = _handler(made)
    if up:
        made.start()
    try:
        yield made
    finally:
        made.released.set()
        if made.up:
            server.shutdown()
        server.server_close()
