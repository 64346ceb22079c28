"""The browser tests' machinery works: a served page runs its script in the real headless
Chromium, and the page's errors (a CSP violation, an uncaught exception) reach the
``page_errors`` list the browser tests assert on."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

# what a page of the web UI will be served with: scripts from the page's own origin only
CSP = "default-src 'self'; script-src 'self'"
PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>smoke</title>
<script src="/app.js" defer></script></head>
<body><p id="status">static</p><button id="go">go</button></body></html>
"""
SCRIPT = """document.getElementById("go").addEventListener("click", () => {
  document.getElementById("status").textContent = "changed by app.js";
});
"""
# an inline script (refused by the CSP) and one that throws
HOSTILE_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>errors</title>
<script>document.title = "inline ran";</script><script src="/throws.js"></script></head>
<body></body></html>
"""


class _Handler(SimpleHTTPRequestHandler):
    def end_headers(self) -> None:
        self.send_header("Content-Security-Policy", CSP)
        super().end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass  # a line on stderr per request is noise in the test's output


@contextmanager
def served(folder: Path) -> Iterator[str]:
    """``folder`` over HTTP from this process, under the CSP; the server's base URL.
    Port 0: the kernel picks a free port as the server binds, so no other test's server
    can take it (reserved_port is for servers in a subprocess, which bind later)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Handler, directory=str(folder)))
    # shutdown() waits for the loop's next poll: 0.5 s by default, per test
    serve = partial(server.serve_forever, poll_interval=0.05)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_served_page_runs_its_script(tmp_path: Path, page, page_errors: list[str]) -> None:
    (tmp_path / "index.html").write_text(PAGE)
    (tmp_path / "app.js").write_text(SCRIPT)
    (tmp_path / "favicon.ico").write_bytes(b"")  # Chromium asks for it: a 404 is an error
    with served(tmp_path) as url:
        page.goto(f"{url}/index.html")
        assert page.text_content("#status") == "static"
        page.click("#go")
        page.wait_for_function(
            "document.getElementById('status').textContent === 'changed by app.js'"
        )
    assert page_errors == []


def test_page_errors_collects_csp_violations_and_uncaught_exceptions(
    tmp_path: Path, page, page_errors: list[str]
) -> None:
    (tmp_path / "index.html").write_text(HOSTILE_PAGE)
    (tmp_path / "throws.js").write_text('throw new TypeError("from throws.js");\n')
    with served(tmp_path) as url:
        page.goto(f"{url}/index.html")
        page.wait_for_function("document.readyState === 'complete'")
        assert page.title() == "errors"  # the inline script was refused
    assert any("Content Security Policy" in error for error in page_errors), page_errors
    assert any("TypeError: from throws.js" in error for error in page_errors), page_errors
