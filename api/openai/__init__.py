"""The OpenAI-compatible surface, under ``/openai/v1``: a caller with the official
``openai`` SDK changes its ``base_url`` and its key, and the funnel answers.

- ``chat``: ``POST /chat/completions`` (one user message, one image, one question: one
  high-priority job, waited for) and ``GET /models`` (a method and an agent each).

Same keys, tenants, rate limits, store, priorities and workers as ``/v1``. Errors here
have OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, which the SDK
reads into its exceptions (``api.errors``); the rest of the API keeps its own.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from api.deps import require_key
from api.openai import chat

PREFIX = "/openai/v1"


def router() -> APIRouter:
    """Every route of the surface, behind the API keys."""
    surface = APIRouter(prefix=PREFIX, dependencies=[Depends(require_key)])
    surface.include_router(chat.router)
    return surface
