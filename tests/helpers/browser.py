"""A real headless browser for the ``browser`` tests: Playwright driving Debian's
Chromium (``make setup`` installs it; Playwright's own browser download is not reachable
everywhere we run, so it is pointed at the system's executable).

The fixtures (``tests/conftest.py``) launch one browser per test module and give each
test a fresh context and page, with what the page reported as errors collected in a
list, so that a test can assert there were none.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Error, Page, sync_playwright

# long enough for a loaded CI machine, short enough that a missing element fails quickly
TIMEOUT_MS = 10_000
INSTALL = "make setup (as root or with passwordless sudo), or apt-get install chromium"


def chromium_or_skip() -> str:
    """The Chromium executable; without it the test skips, saying how to install it, but
    under CI (``CI`` set), where ``make setup`` installs it, its absence is a failure."""
    found = shutil.which("chromium")
    if found is None:
        message = f"no chromium on the PATH (Debian's package): {INSTALL}"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (under CI make setup installs it)", pytrace=False)
        pytest.skip(message)
    return found


@contextmanager
def launched_chromium() -> Iterator[Browser]:
    executable = chromium_or_skip()
    with sync_playwright() as playwright:
        # chromium_sandbox=False (--no-sandbox): Chromium refuses to start its sandbox as
        # root, and the suite runs as root here and in CI. Each launch has a profile
        # folder of its own, so parallel workers' browsers do not meet.
        browser = playwright.chromium.launch(
            executable_path=executable, headless=True, chromium_sandbox=False
        )
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def watched_page(browser: Browser, errors: list[str]) -> Iterator[Page]:
    """A page in a context of its own (no cookies or storage from another test), whose
    console errors (a CSP violation, a resource that failed to load, console.error) and
    uncaught exceptions are appended to ``errors`` as they come."""
    context = browser.new_context()
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    page.on("console", lambda message: _console_error(message, errors))
    page.on("pageerror", lambda error: _uncaught(error, errors))
    try:
        yield page
    finally:
        context.close()


def _console_error(message: ConsoleMessage, errors: list[str]) -> None:
    if message.type == "error":
        where = message.location.get("url") or "?"
        errors.append(f"console error at {where}: {message.text}")


def _uncaught(error: Error, errors: list[str]) -> None:
    errors.append(f"uncaught {error.name}: {error.message}")
