"""One bad job never fails its batch-mates: a batched model call that raises is tried
again on halves of its batch until the failing job stands alone."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from common.errors import ModelError, RetryableError

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


def per_job(call: Callable[[list[T]], list[R]], items: list[T]) -> list[R | ModelError]:
    """``call`` over ``items``; on failure, bisect until each failing item stands alone."""
    if not items:
        return []
    try:
        results = call(items)
    except RetryableError:
        raise
    except Exception as exc:
        if len(items) == 1:
            log.warning("model call failed for one job: %s", exc)
            log.info("the model call's traceback", exc_info=True)  # (with -v)
            return [ModelError(f"{type(exc).__name__}: {exc}")]
        middle = len(items) // 2
        return per_job(call, items[:middle]) + per_job(call, items[middle:])
    if len(results) != len(items):
        raise ModelError(f"backend returned {len(results)} results for {len(items)} jobs")
    return list(results)
