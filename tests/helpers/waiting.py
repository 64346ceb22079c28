"""The one way a test waits: poll a condition with a deadline (never a bare sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    *,
    deadline_s: float,
    every_s: float = 0.1,
    what: str | Callable[[], object] = "condition",
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that. After
    ``deadline_s`` fail, saying ``what`` was awaited (a function: what is still wrong,
    asked at that moment)."""
    end = time.monotonic() + deadline_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {deadline_s} s waiting for {said}")
        time.sleep(every_s)  # (the poll's interval, not a wait for work)
