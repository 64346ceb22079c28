"""The sandbox's tests: a working sandbox (or a clear skip) and what a test may leave
behind (nothing). The constants and checks themselves are ``tests.helpers.sandbox``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from common.sandbox import Sandbox
from tests.helpers.sandbox import bubblewrap_or_skip, leftovers
from tests.helpers.waiting import wait_until


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return bubblewrap_or_skip()


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """Every test ends with no sandbox process, folder, mount or control group left."""
    yield
    wait_until(  # (a killed process the kernel is still tearing down)
        lambda: not leftovers(), deadline_s=5, every_s=0.05, what=lambda: f"none of {leftovers()}"
    )
