"""The OpenAI-compatible surface, under ``/openai/v1``: a caller with the official
``openai`` SDK changes its ``base_url`` and its key, and the funnel answers.

- ``chat``: ``POST /chat/completions`` (one user message, one image, one question: one
  high-priority job, waited for) and ``GET /models`` (a method and an agent each);
- ``files``: the JSONL of requests a batch is made from, and its output and error files
  (``output``: made from the store when read);
- ``batches``: OpenAI's batch over one of ours (``common.store.openai_batches``).

Same keys, tenants, rate limits, store, priorities and workers as ``/v1``. Errors here
have OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, which the SDK
reads into its exceptions (``api.errors``); the rest of the API keeps its own.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from api.deps import require_key
from api.openai import batches, chat, files

PREFIX = "/openai/v1"


def router() -> APIRouter:
    """Every route of the surface, behind the API keys."""
    surface = APIRouter(prefix=PREFIX, dependencies=[Depends(require_key)])
    surface.include_router(chat.router)
    surface.include_router(files.router)
    surface.include_router(batches.router)
    return surface
