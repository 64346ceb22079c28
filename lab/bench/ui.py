"""``speceyes bench ui``: the review UI's pages over a batch of 100,000 jobs, timed.

The batch is written by ``lab.bench.seeded_batch``. ``measure`` GETs pages with any httpx
client (the CLI's in-process ``TestClient``) and reports the server's time: its
``Server-Timing`` (``app;dur=12.3``) where it sends one, else the wall time around the
request.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Mapping
from html import unescape
from typing import NamedTuple, Protocol
from urllib.parse import urljoin

from common.errors import SpecEyesError


class Answer(Protocol):
    """What a page's answer is read for (an httpx ``Response``, of either httpx)."""

    @property
    def status_code(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def headers(self) -> Mapping[str, str]: ...


class Browser(Protocol):
    """A client that keeps cookies: an ``httpx.Client``, or Starlette's ``TestClient``
    (whose httpx is ``httpx2``, a type of its own)."""

    def get(self, url: str) -> Answer: ...
    def post(self, url: str, *, data: dict[str, str], follow_redirects: bool) -> Answer: ...


class Timing(NamedTuple):
    """One page's server time over ``measure``'s repeats; the first request apart."""

    path: str
    median_ms: float
    max_ms: float
    cold_ms: float
    from_header: bool  # Server-Timing's figure (else the wall time around the request)


def page_paths(batch_id: str) -> list[str]:
    """The pages measured: the batch's, and its results unfiltered, filtered and sorted."""
    batch = f"/ui/batches/{batch_id}"
    results = f"{batch}/results"
    filters = [
        "who=small&conf_min=0.8&conf_max=0.95",
        "status=failed",
        "wrong=1",
        "q=red",
        "sort=confidence",
    ]
    return [batch, results, *(f"{results}?{query}" for query in filters)]


_DURATION = re.compile(r"(?:^|,)\s*app\s*;[^,]*?\bdur=([0-9.]+)")
_NEXT = re.compile(r'<a\b[^>]*?(?:rel="next"[^>]*?href="([^"]*)"|href="([^"]*)"[^>]*?rel="next")')
_CSRF_INPUT = re.compile(r'<input\b[^>]*\bname="csrf"[^>]*>')
_VALUE = re.compile(r'\bvalue="([^"]*)"')


def sign_in(client: Browser, secret: str) -> bool:
    """Sign ``client`` in to the UI with an API key's secret (the client keeps the session
    cookie); False where the server has no UI (``/ui/signin`` is 404)."""
    form = client.get("/ui/signin")
    if form.status_code == 404:
        return False
    _check(form, "/ui/signin")
    field = _CSRF_INPUT.search(form.text)
    value = _VALUE.search(field.group()) if field else None
    if value is None:
        raise SpecEyesError("the sign-in form at /ui/signin has no csrf input")
    answer = client.post(
        "/ui/signin",
        data={"key": secret, "csrf": unescape(value.group(1))},
        follow_redirects=False,
    )
    if answer.status_code != 303:
        raise SpecEyesError(
            f"signing in answered {answer.status_code}, not 303: {answer.text[:300]!r}"
        )
    return True


def measure(client: Browser, paths: list[str], repeats: int) -> list[Timing]:
    """Each path GET once (cold), then ``repeats`` times; the server's milliseconds.

    Raises ``SpecEyesError`` on any answer but 200: a page that fails has no time."""
    timings = []
    for path in paths:
        cold, from_header = _server_ms(client, path)
        warm = [_server_ms(client, path)[0] for _ in range(repeats)]
        timings.append(Timing(path, statistics.median(warm), max(warm), cold, from_header))
    return timings


def _server_ms(client: Browser, path: str) -> tuple[float, bool]:
    started = time.perf_counter()
    response = client.get(path)
    wall_ms = (time.perf_counter() - started) * 1000
    _check(response, path)
    found = _DURATION.search(response.headers.get("server-timing", ""))
    return (float(found.group(1)), True) if found else (wall_ms, False)


def _check(response: Answer, path: str) -> None:
    if response.status_code != 200:
        raise SpecEyesError(
            f"GET {path} answered {response.status_code}: {response.text[:300]!r}",
            code=f"http_{response.status_code}",
        )


def next_page(client: Browser, path: str) -> str | None:
    """The page the listing at ``path`` links to as ``rel="next"`` (resolved against
    ``path``), or None where it has no next page."""
    response = client.get(path)
    _check(response, path)
    found = _NEXT.search(response.text)
    if found is None:
        return None
    return urljoin(path, unescape(found.group(1) or found.group(2)))
