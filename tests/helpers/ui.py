"""Signing in to the review pages the way a browser does: the form's token, the key,
the cookie the answer sets."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def form_token(html: str) -> str:
    found = CSRF.search(html)
    assert found, html[:2000]
    return found.group(1)


def sign_in(http: TestClient, key: str, next: str = "/ui/batches") -> object:
    """POST the sign-in form with ``key``; returns the answer (not followed)."""
    token = form_token(http.get("/ui/signin").text)
    return http.post(
        "/ui/signin",
        data={"key": key, "csrf": token, "next": next},
        follow_redirects=False,
    )
