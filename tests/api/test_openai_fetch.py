"""An image named by URL (OpenAI's image_url): fetched only from the hosts the operator
allows, within its bounds (size, time, no redirects), and checked as an upload is."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from common.images import content_hash
from common.store.tables import Job
from tests.helpers.images import png

IMAGE = png(colour=(10, 200, 10))


class _Images(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/a.png")
            self.end_headers()
            return
        if self.path == "/slow":
            self.send_response(200)
            self.end_headers()
            for _ in range(40):  # a byte every 0.1 s: never whole within the bound
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.1)
            return
        body = {"/a.png": IMAGE, "/huge": b"x" * 5000, "/text": b"not an image"}[self.path]
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def images_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _chat(url: str) -> dict:
    content = [{"type": "text", "text": "Q?"}, {"type": "image_url", "image_url": {"url": url}}]
    return {"model": "speceyes-deepeyes", "messages": [{"role": "user", "content": content}]}


def test_an_image_url_is_fetched_only_from_an_allowed_host_within_bounds(api, images_server):
    served = api(
        api_image_url_hosts=["127.0.0.1"],
        api_chat_wait_s=0.2,
        api_image_url_timeout_s=1.0,
        max_upload_bytes=4000,
    )

    def ask(url: str):
        return served.http.post("/openai/v1/chat/completions", json=_chat(url))

    # allowed: fetched, kept as an upload (no worker here: the answer is a timeout)
    answer = ask(f"{images_server}/a.png")
    assert answer.status_code == 504, answer.text
    with served.sessions() as session:
        (job,) = session.query(Job).all()
        assert job.image_hash == content_hash(IMAGE)
    refusals = {
        "http://10.0.0.7/a.png": "image_url_refused",  # not allowed (and private)
        images_server.replace("127.0.0.1", "localhost") + "/a.png": "image_url_refused",
        "ftp://127.0.0.1/a.png": "image_url_refused",
        f"{images_server}/moved": "image_url_unreadable",  # no redirect is followed
        f"{images_server}/huge": "image_url_unreadable",  # over max_upload_bytes
        f"{images_server}/slow": "image_url_unreadable",  # not whole within the bound
        f"{images_server}/text": "image_invalid",
    }
    for url, code in refusals.items():
        refused = ask(url)
        assert refused.status_code == 400, (url, refused.text)
        assert refused.json()["error"]["code"] == code, (url, refused.json())
    assert served.jobs() == 1
