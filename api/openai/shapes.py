"""The OpenAI chat shapes we read and write: a request as the SDK sends it (what we
cannot honour is named, to refuse it), and a ``chat.completion`` as the SDK parses it,
with our facts under ``speceyes``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from common.contracts import AnsweredBy
from common.store.tables import Job


class ImageUrl(BaseModel):
    url: str
    detail: str | None = None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None
    image_url: ImageUrl | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[ContentPart] | None = None


class Extension(BaseModel):
    """What only SpecEyes reads, under ``speceyes`` (the SDK's ``extra_body``)."""

    model_config = ConfigDict(extra="forbid")

    options: list[str] | None = Field(
        None, description="multiple choice, in order (A, B, ...); else the text may list them"
    )


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # (max_tokens, user, seed...: read, not used)

    model: str
    messages: list[Message] = Field(min_length=1)
    stream: bool | None = None
    n: int | None = None
    temperature: float | None = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    speceyes: Extension | None = None


class AnswerMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None


class Choice(BaseModel):
    index: int = 0
    message: AnswerMessage
    finish_reason: Literal["stop"] = "stop"
    logprobs: None = None


class Facts(BaseModel):
    """How the funnel answered."""

    job_id: str
    answered_by: str | None = Field(description="small (accepted by the gate) or large")
    confidence: float | None = Field(description="the gate's, where the small model's answer won")
    trajectory: str = Field(description="the agent's steps, where it ran: GET this path")


class Usage(BaseModel):
    """Tokens as we count them: the answer's generated tokens (the agent's steps, with a
    SpecReason round's rejected proposals, as the reference counts them; or the small
    model's answer). Prompts are not counted: 0."""

    prompt_tokens: int = 0
    completion_tokens: int
    total_tokens: int


def usage_of(job: Job) -> Usage:
    steps = (job.trajectory or {}).get("steps") or []
    if job.answered_by == AnsweredBy.SMALL or not steps:
        generated = len(job.token_scores or [])
    else:
        generated = sum(
            int(step.get("new_tokens") or 0) + int(step.get("proposal_tokens") or 0)
            for step in steps
        )
    return Usage(completion_tokens=generated, total_tokens=generated)


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    speceyes: Facts


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "speceyes"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


def completion_of(job: Job, model: str) -> ChatCompletion:
    """A job that is done, as the ``chat.completion`` that answers its request."""
    facts = Facts(
        job_id=job.id,
        answered_by=job.answered_by,
        confidence=job.confidence if job.answered_by == AnsweredBy.SMALL else None,
        trajectory=f"/v1/jobs/{job.id}/trace",
    )
    return ChatCompletion(
        id=f"chatcmpl-{job.id}",
        created=int(job.created_at.timestamp()),
        model=model,
        choices=[Choice(message=AnswerMessage(content=job.given_answer))],
        usage=usage_of(job),
        speceyes=facts,
    )
