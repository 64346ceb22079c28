"""One client for OpenAI-compatible servers, and the one retry policy of the service.

``ChatClient`` talks to one server's ``/chat/completions`` (vLLM, SGLang, a judge) for
as long as the process lives: one pooled ``httpx.Client``, so connections are reused
across micro-batches, agent steps and judge prompts, and a thread pool that keeps up to
``concurrency`` requests in flight (an inference server batches concurrent requests).
The model backend (``backends.server_backend``) and the judge (``judge``) both use it.

``Backoff`` is how long to wait before trying again, everywhere: here between tries of a
request, and in the workers before re-sending work after an outage. It doubles from
``first_s``, is capped at ``max_s``, and is jittered (x0.5-1, so that many clients do
not come back together); a server's ``Retry-After`` wins, within the cap.

The library choice: httpx, with tenacity for the retry loop. The requests carry vLLM's
own fields (``continue_final_message``, ``include_stop_str_in_output``, top logprobs
with their placeholders) as plain JSON, and replies are read as JSON, which the openai
SDK would have to be steered around (``extra_body``, its own types and its own retry
policy beside ours).
"""

from __future__ import annotations

import email.utils
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt

from common.errors import BackendUnavailable, ModelError

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Backoff:
    """The wait before try ``attempt + 1``: doubling from ``first_s``, at most ``max_s``,
    jittered; a server's ``Retry-After`` instead where it gives one (within the cap)."""

    first_s: float = 0.5
    max_s: float = 8.0

    def delay_s(self, attempt: int, retry_after_s: float | None = None) -> float:
        if retry_after_s is not None:
            return min(self.max_s, max(0.0, retry_after_s))
        full = min(self.max_s, self.first_s * 2 ** max(0, attempt - 1))
        return full * random.uniform(0.5, 1.0)


def retry_after_s(response: httpx.Response) -> float | None:
    """A response's ``Retry-After`` (seconds or an HTTP date) in seconds, if it has one."""
    value = response.headers.get("retry-after")
    return None if value is None else seconds_of_retry_after(value)


def seconds_of_retry_after(value: str) -> float | None:
    """A ``Retry-After`` value (seconds or an HTTP date) in seconds; None if neither."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class Refused(Exception):
    """The server answered a request with a status that trying again will not change."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


class _TryAgain(Exception):
    def __init__(self, problem: str, retry_after: float | None = None) -> None:
        super().__init__(problem)
        self.retry_after = retry_after


class ChatClient:
    """A long-lived client of one server's ``/chat/completions`` (see the module text)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        retries: int = 3,
        backoff: Backoff | None = None,
        concurrency: int = 16,
        name: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.name = name or base_url
        self.retries = retries
        self.backoff = backoff or Backoff()
        self.concurrency = concurrency
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=timeout_s,
            transport=transport,
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        )
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._sleep = time.sleep  # (tests record the waits instead)

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """One chat completion (its JSON). 429, 5xx and lost connections are tried again
        per ``backoff``, ``retries`` times, then ``BackendUnavailable``; another refusal
        raises ``Refused`` at once."""
        retrying = Retrying(
            stop=stop_after_attempt(self.retries + 1),
            retry=retry_if_exception_type(_TryAgain),
            wait=self._wait,
            sleep=lambda seconds: self._sleep(seconds),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    return self._once(body)
        except _TryAgain as exc:
            tries = self.retries + 1
            raise BackendUnavailable(f"{self.name}: {exc} ({tries} tries)") from None
        raise AssertionError("unreachable: tenacity returns or raises")

    def complete_all(self, bodies: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every body at once, at most ``concurrency`` in flight; the replies in order."""
        if len(bodies) == 1:
            return [self.complete(bodies[0])]
        return list(self._threads().map(self.complete, bodies))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self.http.close()

    def _once(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = self.http.post("/chat/completions", json=body)
        except httpx.TransportError as exc:
            raise _TryAgain(f"{type(exc).__name__}: {exc}") from None
        if response.status_code in RETRY_STATUSES:
            detail = response.text[:200]
            raise _TryAgain(f"HTTP {response.status_code}: {detail}", retry_after_s(response))
        if response.status_code >= 400:
            raise Refused(response)
        try:
            reply: dict[str, Any] = response.json()
        except ValueError:
            raise ModelError(f"{self.name}: not JSON: {response.text[:200]}") from None
        return reply

    def _wait(self, state: RetryCallState) -> float:
        failed = state.outcome.exception() if state.outcome is not None else None
        after = failed.retry_after if isinstance(failed, _TryAgain) else None
        return self.backoff.delay_s(state.attempt_number, after)

    def _threads(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="chat")
            return self._pool
