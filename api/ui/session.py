"""Sign-in to the review pages: a signed session cookie, and CSRF tokens bound to it.

A person signs in with an API key. The cookie never holds the key: it holds the key's
id, when it was issued and a random nonce, signed (HMAC-SHA256) with the server's
secret (``api.session_secret``, else a new one at each start). It is HttpOnly and
SameSite=Strict, and Secure when the page was asked for over HTTPS. Each request checks
the signature, the age (``api.session_hours``) and that the key is still live: a revoked
key signs its sessions out at once.

Every form carries a CSRF token: an HMAC of the session's nonce, so it is worth nothing
without the cookie and nothing in another session. The sign-in form, which comes before
any session, binds its token to a short-lived cookie of its own.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass

from fastapi import Request, Response
from sqlalchemy.orm import Session

from api.deps import Caller
from api.errors import ApiError
from common.config import Settings
from common.store.tables import ApiKey

SESSION_COOKIE = "speceyes_session"
SIGNIN_COOKIE = "speceyes_signin"
SIGNIN_MAX_AGE_S = 3600


@dataclass(frozen=True)
class UiSession:
    """A signed-in browser: who (as the API sees a key), its CSRF token, and the key's id
    (its rate limit is the API's: one bucket a key, pages and /v1 alike)."""

    caller: Caller
    csrf: str
    key_id: str | None = None


class Signer:
    """Signs and checks cookie values and tokens with one secret."""

    def __init__(self, settings: Settings) -> None:
        configured = settings.api.session_secret
        self._secret = (
            configured.get_secret_value().encode() if configured else secrets.token_bytes(32)
        )
        self.max_age_s = settings.api.session_hours * 3600

    def mac(self, purpose: str, value: str) -> str:
        message = f"{purpose}|{value}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def seal(self, payload: Mapping[str, object]) -> str:
        body = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode()
        return f"{body}.{self.mac('session', body)}"

    def open(self, value: str) -> dict[str, object] | None:
        body, _, signature = value.partition(".")
        if not same(signature, self.mac("session", body)):
            return None
        try:
            payload = json.loads(base64.urlsafe_b64decode(body.encode()))
        except ValueError:
            return None
        issued = payload.get("t") if isinstance(payload, dict) else None
        if not isinstance(issued, int | float) or time.time() - issued > self.max_age_s:
            return None
        return payload


def start_session(response: Response, request: Request, signer: Signer, key: ApiKey | None) -> None:
    """Set the session cookie for ``key`` (None: keys are off)."""
    payload = {"k": key.id if key else None, "t": int(time.time()), "n": secrets.token_hex(16)}
    _set_cookie(response, request, SESSION_COOKIE, signer.seal(payload), int(signer.max_age_s))
    response.delete_cookie(SIGNIN_COOKIE, path="/ui")


def end_session(response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/ui")


def current_session(
    request: Request, session: Session, signer: Signer, settings: Settings
) -> UiSession | None:
    """The signed-in browser's session, or None (no cookie, a bad or old one, a key
    revoked since)."""
    payload = signer.open(request.cookies.get(SESSION_COOKIE, ""))
    if payload is None:
        return None
    csrf = signer.mac("csrf", str(payload.get("n")))
    key_id = payload.get("k")
    if key_id is None:
        if settings.api.require_keys:
            return None
        return UiSession(Caller(tenant=None, admin=True), csrf)
    key = session.get(ApiKey, str(key_id))
    if key is None or key.revoked_at is not None:
        return None
    return UiSession(Caller(tenant=key.tenant, admin=key.admin, name=key.name), csrf, key.id)


def signin_nonce(request: Request) -> str:
    """The nonce the sign-in form's token is bound to: the browser's, else a new one."""
    return request.cookies.get(SIGNIN_COOKIE) or secrets.token_hex(16)


def remember_signin(response: Response, request: Request, nonce: str) -> None:
    _set_cookie(response, request, SIGNIN_COOKIE, nonce, SIGNIN_MAX_AGE_S)


def check_signin_token(request: Request, signer: Signer, token: str) -> None:
    nonce = request.cookies.get(SIGNIN_COOKIE, "")
    if not nonce or not same(token, signer.mac("signin", nonce)):
        raise ApiError(
            403, "csrf_failed", "the sign-in form is stale or not this site's: load it again"
        )


def check_csrf(ui: UiSession, token: str) -> None:
    """Refuse a form that does not carry this session's token."""
    if not same(token, ui.csrf):
        raise ApiError(
            403, "csrf_failed", "the form is stale or not this site's: reload the page, try again"
        )


def same(given: str, expected: str) -> bool:
    """A constant-time comparison of what a browser sent (any text) with a token."""
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode())


def _set_cookie(response: Response, request: Request, name: str, value: str, age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=age,
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
