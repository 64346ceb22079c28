"""What routes depend on: the settings, the store, the dispatcher and the caller's key.

Everything lives on ``app.state`` (set by ``create_app``); the ``...Dep`` aliases are what
a route's signature names, so a route reads as what it needs.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from api.errors import ApiError
from common.config import Settings
from common.dispatch import Dispatcher
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


def require_key(request: Request, config: SettingsDep, store: SessionsDep) -> None:
    """A live API key: ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``."""
    if not config.api_require_keys:
        return
    header = request.headers.get("authorization", "")
    key = header.removeprefix("Bearer ").strip() or request.headers.get("x-api-key", "")
    if not key:
        raise ApiError(401, "unauthorized", "missing API key: Authorization: Bearer KEY")
    with store() as session:
        if check_key(session, key) is None:
            raise ApiError(401, "unauthorized", "unknown or revoked API key")


def limit_body(request: Request, config: SettingsDep) -> None:
    """Refuse a body whose declared length is over ``max_request_bytes``."""
    length = int(request.headers.get("content-length") or 0)
    if length > config.max_request_bytes:
        raise ApiError(
            413,
            "max_request_bytes",
            f"the request has {length} bytes; the limit (max_request_bytes) is "
            f"{config.max_request_bytes}",
        )
