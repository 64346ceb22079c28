"""The composition root's one choice: how committed jobs reach their stage.

With a broker configured, the Celery dispatcher (workers anywhere run the stages); without
one, the embedded runner (this process runs them, models loaded on first use).
"""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from common.backends import load_models
from common.config import Settings
from common.dispatch import Dispatcher
from common.runner import EmbeddedRunner
from common.sandbox import require_code_sandbox
from workers.queues import CeleryDispatcher


def make_dispatcher(settings: Settings, sessions: sessionmaker[Session]) -> Dispatcher:
    if settings.broker.url:
        return CeleryDispatcher(settings)

    require_code_sandbox(settings)  # this process will run the agent
    return EmbeddedRunner(sessions, lambda: load_models(settings), settings)
