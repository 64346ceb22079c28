"""The HTTP API: enqueue jobs, submit batches, poll by id, stream results.

``create_app`` wires the pieces: the settings, the job store, the dispatcher that takes
committed jobs to their stage (chosen by the caller: Celery with a broker, the embedded
runner without one; ``speceyes serve`` picks), the error handlers and the routes
(``api.routes``). This package never imports the workers or torch: jobs are committed,
then handed to the dispatcher.

Every /v1 route needs an API key (``Authorization: Bearer KEY`` or ``X-API-Key: KEY``;
``speceyes keys create NAME``). Every error answer has one shape:
``{"error": "<code>", "detail": "<what to do>"}``. A corrupt or non-image upload is
refused with 422 before any job is created.

The app sends webhooks too (``common.pipeline.notify``: a thread from start to shutdown,
beside those of the workers).

The review pages (``api.ui``) are served under /ui by the same app: the same store, the
same keys and tenants, the same read functions.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI
from sqlalchemy.orm import Session, sessionmaker

from api import docs, openai, ui
from api.access_log import AccessLog
from api.deps import Limiters, require_key
from api.errors import install_handlers
from api.middleware import BodyLimit
from api.routes import batches, health, jobs, usage, webhooks
from common.config import Settings
from common.pipeline.dispatch import Dispatcher, StoreOnly
from common.pipeline.notify import Notifier
from common.pipeline.windows import WindowKeeper
from common.store.db import open_store

log = logging.getLogger(__name__)


def create_app(
    settings: Settings,
    *,
    dispatcher: Dispatcher | None = None,
    sessions: sessionmaker[Session] | None = None,
) -> FastAPI:
    """The API over the store of ``settings`` (or ``sessions``).

    Committed jobs go to ``dispatcher``, started with the app and closed with it; without
    one they wait in the store for whoever works it.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.sessions = sessions or open_store(settings.database_url)
        if dispatcher is None:
            log.warning("no dispatcher: jobs will wait in the store")
        app.state.dispatcher = dispatcher or StoreOnly()
        app.state.dispatcher.start()
        notifier = Notifier(app.state.sessions, settings.webhooks)  # (webhooks go out)
        notifier.start()
        windows = WindowKeeper(app.state.sessions)  # (OpenAI batches' completion windows)
        windows.start()
        yield
        windows.stop()
        notifier.stop()
        app.state.dispatcher.close()
        if sessions is None:
            app.state.sessions.close()

    app = FastAPI(
        title="SpecEyes",
        version="1",
        description="A speculative funnel in front of agentic vision-language models.",
        lifespan=lifespan,
        docs_url=None,  # (api.docs serves it, with no CDN)
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.limiters = Limiters.of(settings)
    install_handlers(app)
    app.add_middleware(BodyLimit, limit=settings.api.max_request_bytes)
    app.add_middleware(AccessLog)  # added last: outermost, so it sees every answer
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_key)])
    v1.include_router(jobs.router)
    v1.include_router(batches.router)
    v1.include_router(webhooks.router)
    v1.include_router(usage.router)
    app.include_router(v1)
    app.include_router(openai.router())  # (OpenAI's shapes, under /openai/v1)
    app.include_router(health.router)
    ui.install(app, settings)  # the review pages under /ui, on the same store and keys
    docs.install(app)  # /docs, whole from this server
    return app
