"""What routes depend on: the settings, the store, the dispatcher and the caller.

Everything lives on ``app.state`` (set by ``create_app``); the ``...Dep`` aliases are what
a route's signature names, so a route reads as what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from api.errors import ApiError
from api.limiter import RateLimiter
from common.config import Settings
from common.contracts import Priority
from common.pipeline.dispatch import Dispatcher
from common.store.keys import check_key


def settings(request: Request) -> Settings:
    value: Settings = request.app.state.settings
    return value


def sessions(request: Request) -> sessionmaker[Session]:
    value: sessionmaker[Session] = request.app.state.sessions
    return value


def dispatcher(request: Request) -> Dispatcher:
    value: Dispatcher = request.app.state.dispatcher
    return value


SettingsDep = Annotated[Settings, Depends(settings)]
SessionsDep = Annotated[sessionmaker[Session], Depends(sessions)]
DispatcherDep = Annotated[Dispatcher, Depends(dispatcher)]


@dataclass(frozen=True)
class Caller:
    """Who is calling: the key's tenant, and whether it may read every tenant's work."""

    tenant: str | None  # None: keys are off (api_require_keys false): one open tenant
    admin: bool
    name: str = "anonymous"  # the key's name: who a review was given by
    max_priority: int = Priority.HIGH.rank  # the most urgent its jobs may ask for (a rank)

    def may_read(self, owner: str | None) -> bool:
        return self.admin or owner == self.tenant

    def priority(self, asked: Priority | None, default: Priority) -> int:
        """The rank new jobs wait at: ``asked``, if the key allows it (else a 403), or
        ``default``, lowered to what the key allows."""
        if asked is None:
            return max(default.rank, self.max_priority)
        if asked.rank < self.max_priority:
            allowed = Priority.of_rank(self.max_priority)
            raise ApiError(
                403,
                "priority_not_allowed",
                f"this key's jobs may ask for {allowed} priority at most, not {asked}",
            )
        return asked.rank


@dataclass
class Limiters:
    """The API's per-process rate limits (``api.limiter``)."""

    requests: RateLimiter  # per API key
    auth_failures: RateLimiter  # per client address

    @classmethod
    def of(cls, config: Settings) -> Limiters:
        per_s = config.api.auth_failures_per_min / 60.0
        return cls(
            RateLimiter(config.api.rate_per_s, config.api.rate_burst),
            RateLimiter(per_s, config.api.auth_failures_per_min),
        )


def require_key(request: Request, config: SettingsDep, store: SessionsDep) -> Caller:
    """A live API key (``Authorization: Bearer KEY`` or ``X-API-Key: KEY``) within its
    rate; an address that keeps failing to authenticate is turned away for a while."""
    if not config.api.require_keys:
        return Caller(tenant=None, admin=True)
    limiters: Limiters = request.app.state.limiters
    address = request.client.host if request.client else "unknown"
    if wait := limiters.auth_failures.wait_s(address):
        raise too_many(
            "auth_failures",
            f"over {config.api.auth_failures_per_min} failed authentications a minute from this "
            "address (api_auth_failures_per_min): every key is refused from here until the "
            "wait is over, a valid one too",
            wait,
        )
    header = request.headers.get("authorization", "")
    key = header.removeprefix("Bearer ").strip() or request.headers.get("x-api-key", "")
    with store() as session:
        row = check_key(session, key) if key else None
    if row is None:
        limiters.auth_failures.take(address)
        if not key:
            raise ApiError(401, "unauthorized", "missing API key: Authorization: Bearer KEY")
        raise ApiError(401, "unauthorized", "unknown or revoked API key")
    request.state.key_name = row.name  # for the access log (api.access_log)
    if wait := limiters.requests.take(row.id):
        raise too_many(
            "rate_limited",
            f"over {config.api.rate_per_s:g} requests/s for this key (api_rate_per_s)",
            wait,
        )
    return Caller(row.tenant, row.admin, row.name, row.max_priority)


CallerDep = Annotated[Caller, Depends(require_key)]


def too_many(error: str, detail: str, wait_s: float) -> ApiError:
    """A 429 telling the client when to come back (whole seconds, at least 1)."""
    seconds = max(1, int(wait_s + 0.999))
    return ApiError(429, error, f"{detail}; retry after {seconds} s", {"Retry-After": str(seconds)})
