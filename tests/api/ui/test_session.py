"""The review pages' session cookie, read by itself: what a browser sends is checked for
its signature, its shape, its age and, without a key in it, whether keys are off.
(The pages' own tests sign in through the forms: tests/api/ui/test_pages.py.)"""

from __future__ import annotations

import base64
import time

import pytest
from starlette.requests import Request

from api.ui.session import (
    SESSION_COOKIE,
    SIGNIN_COOKIE,
    Signer,
    current_session,
    signin_nonce,
)
from common.config import Settings


def _request(**cookies: str) -> Request:
    header = "; ".join(f"{name}={value}" for name, value in cookies.items())
    return Request({"type": "http", "headers": [(b"cookie", header.encode())] if cookies else []})


@pytest.fixture
def signer() -> Signer:
    return Signer(Settings(**{"api.session_secret": "s" * 32, "api.session_hours": 1}))


def test_a_session_past_its_age_is_refused(signer):
    fresh = {"k": None, "t": int(time.time()) - 3500, "n": "a"}
    stale = {"k": None, "t": int(time.time()) - 3700, "n": "a"}
    assert signer.open(signer.seal(fresh)) == fresh
    assert signer.open(signer.seal(stale)) is None


@pytest.mark.parametrize(
    "body",
    [
        "not base64 at all!",
        base64.urlsafe_b64encode(b"\xff\xfe not utf-8").decode(),
        base64.urlsafe_b64encode(b"{not json").decode(),
        base64.urlsafe_b64encode(b'{"t": "an hour ago"}').decode(),
        base64.urlsafe_b64encode(b"[1, 2]").decode(),
    ],
)
def test_a_signed_value_of_the_wrong_shape_is_no_session(signer, body):
    """Signed with our secret (so only a bug of ours could make one), yet not a session:
    refused, never an error."""
    assert signer.open(f"{body}.{signer.mac('session', body)}") is None


def test_a_forged_signature_is_refused(signer):
    sealed = signer.seal({"k": None, "t": int(time.time()), "n": "a"})
    body, _, _ = sealed.partition(".")
    assert signer.open(f"{body}.{'0' * 64}") is None


@pytest.mark.parametrize("keys_required", [True, False])
def test_a_session_without_a_key_is_an_admins_only_where_keys_are_off(keys_required):
    """Where keys are off the pages are the operator's (every tenant's batches); where
    they are required, a cookie naming no key signs nobody in."""
    settings = Settings(**{"api.require_keys": keys_required, "api.session_secret": "s" * 32})
    signer = Signer(settings)
    cookie = signer.seal({"k": None, "t": int(time.time()), "n": "a"})
    found = current_session(_request(**{SESSION_COOKIE: cookie}), None, signer, settings)  # type: ignore[arg-type]
    if keys_required:
        assert found is None
    else:
        assert found is not None and found.caller.admin and found.caller.tenant is None
        assert found.csrf == signer.mac("csrf", "a")


def test_the_sign_in_forms_nonce_is_the_browsers_own_while_it_has_one():
    assert signin_nonce(_request(**{SIGNIN_COOKIE: "abc123"})) == "abc123"
    first, second = signin_nonce(_request()), signin_nonce(_request())
    assert len(first) == 32 and first != second  # (a new one each time, none given)
