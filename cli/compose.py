"""The composition root's one choice: how committed jobs reach their stage.

With a broker configured, the Celery dispatcher (workers anywhere run the stages); without
one, the embedded runner (this process runs them, models loaded on first use).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from common.backends import check_models, load_models
from common.config import Settings
from common.pipeline.dispatch import Dispatcher
from common.pipeline.runner import EmbeddedRunner
from common.sandbox import require_code_sandbox
from workers.queues import CeleryDispatcher


def make_dispatcher(
    settings: Settings,
    sessions: sessionmaker[Session],
    say: Callable[[str], None] | None = None,
) -> Dispatcher:
    """``say``: told what loads when the embedded runner loads its models (default: the
    log). A model that cannot be had is refused here, before any job exists."""
    if settings.broker.url:
        return CeleryDispatcher(settings)

    require_code_sandbox(settings)  # this process will run the agent
    check_models(settings)
    if say is None:
        return EmbeddedRunner(sessions, lambda: load_models(settings), settings)
    return EmbeddedRunner(sessions, lambda: load_models(settings, say=say), settings)
