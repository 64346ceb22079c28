"""A chat request read into a job: what ``POST /openai/v1/chat/completions`` and each
line of a batch file ask, checked the same way. Whatever is wrong is an ``ApiError``:
the chat route answers it, a batch line fails alone with its code and message."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from api.errors import ApiError
from api.intake import (
    StoredImage,
    check_spec,
    image_from_base64,
    image_from_bytes,
    validated,
)
from api.openai import fetch
from api.openai.shapes import ChatRequest, Message
from api.schemas import JobSpec
from common.config import Method, Settings
from common.store.new_jobs import NewItem

METHODS: tuple[Method, ...] = ("speceyes", "specreason")
FILE_ID = re.compile(r"file-[0-9a-f]{32}")  # (an uploaded file's id)


@dataclass(frozen=True)
class Asked:
    """One chat request, read: the model it named, its method, the question, the
    options (if given apart) and the image's base64."""

    model: str
    method: Method
    question: str
    options: list[str] | None
    image_base64: str | None  # a data: URL's payload
    image_url: str | None = None  # else a URL on an allowed host, fetched with the item
    image_file: str | None = None  # else an uploaded image's file id (purpose=vision)


def model_names(settings: Settings) -> dict[str, Method]:
    """The models a caller may name: each method, on the agent this deployment runs."""
    return {f"{method}-{settings.agent.kind}": method for method in METHODS}


def read_chat(raw: Any, settings: Settings) -> Asked:
    """A chat request's body, read and checked (its image not yet decoded)."""
    body = validated(ChatRequest, raw)
    method = _method(body.model, settings)
    _refuse_what_the_funnel_cannot_honour(body)
    question, url = _question_and_image(body.messages)
    options = body.speceyes.options if body.speceyes else None
    check_spec(JobSpec(question=question, options=options), settings)
    payload = _data_url_payload(url)
    if payload is not None:
        return Asked(body.model, method, question, options, payload)
    if FILE_ID.fullmatch(url):
        return Asked(body.model, method, question, options, None, image_file=url)
    fetch.check_allowed(url, settings)  # (a refused URL makes no job: it is not fetched)
    return Asked(body.model, method, question, options, None, image_url=url)


def item_of(
    asked: Asked,
    position: int,
    item_id: str,
    settings: Settings,
    rank: int,
    uploaded: Callable[[str], StoredImage],
) -> NewItem:
    """The job's item, its image decoded, checked and kept (``api.intake``): fetched
    where it is a URL, found with ``uploaded`` where it is a file id."""
    if asked.image_base64 is not None:
        stored = image_from_base64(asked.image_base64, settings)
    elif asked.image_file is not None:
        stored = uploaded(asked.image_file)
    else:
        stored = image_from_bytes(fetch.image_bytes(asked.image_url or "", settings), settings)
    return NewItem(
        position, item_id, asked.question, asked.options, stored.path, stored.digest, priority=rank
    )


def _method(model: str, settings: Settings) -> Method:
    names = model_names(settings)
    if model not in names:
        raise ApiError(
            404,
            "model_not_found",
            f"the model {model[:80]!r} does not exist here; the models are "
            f"{', '.join(names)} (GET /openai/v1/models)",
        )
    return names[model]


def _refuse_what_the_funnel_cannot_honour(body: ChatRequest) -> None:
    if body.stream:
        raise ApiError(400, "stream_unsupported", "stream: the funnel answers whole answers only")
    if body.n not in (None, 1):
        raise ApiError(400, "n_unsupported", "n: the funnel gives one answer a request")
    if body.tools or body.functions:
        raise ApiError(
            400,
            "tools_unsupported",
            "tools: the agent's own tools are the protocol's; a caller's are not offered to it",
        )
    if body.temperature not in (None, 0.0):
        raise ApiError(
            400,
            "temperature_unsupported",
            f"temperature {body.temperature}: the method decodes greedily (temperature 0, "
            "as its gate was calibrated); leave it out or send 0",
        )


def _question_and_image(messages: list[Message]) -> tuple[str, str]:
    """The one user message's text (its parts joined by newlines) and its image's URL."""
    if len(messages) != 1 or messages[0].role != "user":
        raise ApiError(
            400,
            "one_user_message",
            "messages: exactly one, from the user (the agent's system prompt is the "
            "protocol's own; a conversation is not continued)",
        )
    content = messages[0].content
    parts = content if isinstance(content, list) else []
    texts = [part.text or "" for part in parts if part.type == "text"]
    images = [part.image_url.url for part in parts if part.type == "image_url" and part.image_url]
    others = sorted({part.type for part in parts} - {"text", "image_url"})
    if others:
        raise ApiError(400, "content_unsupported", f"content parts of type {others} are not read")
    if len(images) != 1:
        raise ApiError(
            400,
            "one_image",
            f"the message holds {len(images)} images; a request is one image and one question",
        )
    question = "\n".join(text for text in texts if text.strip())
    if not question:
        raise ApiError(400, "question_missing", "the message holds no text: the question")
    return question, images[0]


def _data_url_payload(url: str) -> str | None:
    """The base64 of a ``data:image/...;base64,`` URL; None for any other URL."""
    head, comma, payload = url.partition(",")
    head = head.lower()  # (a scheme and its parameters are case-blind)
    if head.startswith("data:") and head.endswith(";base64") and comma:
        return payload
    return None
