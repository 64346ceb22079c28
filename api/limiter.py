"""Token buckets, one per key: requests per second per API key, and failed
authentications per client address.

A bucket holds up to ``burst`` tokens and gains ``rate`` a second; a request takes one.
An empty bucket answers how long until the next token, which becomes the 429's
``Retry-After``. Buckets live in this process (each API replica limits on its own: with
R replicas behind a balancer a key gets up to R times the rate); idle ones are dropped,
so a flood of distinct keys or addresses cannot grow memory without bound.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class RateLimiter:
    """``rate`` events a second per key, bursts of up to ``burst``."""

    def __init__(
        self,
        rate: float,
        burst: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 100_000,
    ) -> None:
        self.rate, self.burst, self.clock, self.max_keys = rate, burst, clock, max_keys
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        """Take a token for ``key``: 0.0 if there was one, else seconds until there is."""
        with self._lock:
            tokens = self._tokens(key)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, self.clock())
                return 0.0
            return (1.0 - tokens) / self.rate

    def wait_s(self, key: str) -> float:
        """Seconds until ``key`` has a token (0.0: it has one now); takes nothing."""
        with self._lock:
            tokens = self._tokens(key)
            return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate

    def _tokens(self, key: str) -> float:
        now = self.clock()
        if key not in self._buckets and len(self._buckets) >= self.max_keys:
            self._drop_full(now)
        tokens, at = self._buckets.get(key, (self.burst, now))
        return min(self.burst, tokens + (now - at) * self.rate)

    def _drop_full(self, now: float) -> None:
        """Forget buckets that have refilled (they hold nothing a new one would not)."""
        refill_s = self.burst / self.rate
        self._buckets = {
            key: (tokens, at) for key, (tokens, at) in self._buckets.items() if now - at < refill_s
        }
