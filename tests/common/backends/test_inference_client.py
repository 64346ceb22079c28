"""The service's one client for OpenAI-compatible servers and its one retry policy."""

from __future__ import annotations

import email.utils
import time

import httpx
import pytest

from common.backends.inference_client import Backoff, ChatClient, Refused
from common.errors import BackendUnavailable

REPLY = {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}


def client(answers: list[httpx.Response], **options) -> tuple[ChatClient, list[float]]:
    """A client whose server answers ``answers`` in turn, and the waits it slept."""
    waits: list[float] = []
    queue = list(answers)
    made = ChatClient(
        "http://judge/v1", transport=httpx.MockTransport(lambda request: queue.pop(0)), **options
    )
    made._sleep = waits.append  # (tenacity's sleep, recorded instead of slept)
    return made, waits


def test_the_backoff_doubles_is_capped_and_jittered():
    policy = Backoff(first_s=1.0, max_s=5.0)
    for attempt, full in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (9, 5.0)):
        waits = [policy.delay_s(attempt) for _ in range(200)]
        assert all(full / 2 <= wait <= full for wait in waits)
        assert max(waits) - min(waits) > full / 10  # not all in step


def test_retry_after_wins_within_the_cap_in_seconds_or_as_a_date():
    answers = [
        httpx.Response(429, headers={"Retry-After": "3"}),
        httpx.Response(503, headers={"Retry-After": email.utils.formatdate(time.time() + 60)}),
        httpx.Response(200, json=REPLY),
    ]
    made, waits = client(answers, retries=3, backoff=Backoff(first_s=0.1, max_s=10.0))
    assert made.complete({}) == REPLY
    assert waits[0] == 3.0 and 9.0 < waits[1] <= 10.0  # the date's 60 s, capped at 10


def test_after_the_last_try_it_reports_at_once_without_waiting():
    made, waits = client([httpx.Response(503)] * 3, retries=2)
    with pytest.raises(BackendUnavailable, match=r"HTTP 503.*\(3 tries\)"):
        made.complete({})
    assert len(waits) == 2  # between the three tries, none after the last


def test_a_refusal_is_not_tried_again():
    made, waits = client([httpx.Response(400, json={"error": "bad"})], retries=3)
    with pytest.raises(Refused):
        made.complete({})
    assert waits == []
