"""Token buckets: bursts, refill, Retry-After, and a bounded number of buckets."""

from __future__ import annotations

import pytest

from api.limiter import RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_then_one_token_per_interval():
    clock = Clock()
    limiter = RateLimiter(rate=2.0, burst=3, clock=clock)
    assert [limiter.take("k") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("k") == pytest.approx(0.5)  # the next token in 1 / rate s
    assert limiter.take("other") == 0.0  # buckets are per key
    clock.now = 0.5
    assert limiter.wait_s("k") == 0.0 and limiter.take("k") == 0.0
    assert limiter.take("k") == pytest.approx(0.5)


def test_refilled_buckets_are_forgotten_when_there_are_too_many():
    clock = Clock()
    limiter = RateLimiter(rate=1.0, burst=2, clock=clock, max_keys=10)
    for key in range(10):
        limiter.take(str(key))
    clock.now = 5.0  # all of them full again
    limiter.take("new")
    assert len(limiter._buckets) == 1
