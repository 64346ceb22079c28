"""What the /v1 routes and the review pages (``api.ui``) share: another tenant's work as
absent as a missing one, a results filter read from a query string, a job's image as a
person is shown it, and a review.

The pages and the API call these same functions (and, below them, the same store
functions), so what a page shows or changes is what /v1 shows or changes.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from fastapi import Response
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from api.deps import Caller
from common.config import Settings
from common.contracts import JobStatus
from common.errors import InvalidInput, NotFound
from common.images import render_image
from common.store import reads, reviews
from common.store.browse import SORTS, WHO, ResultFilter
from common.store.tables import Batch, Job

PREVIEW_SIDE = 1600  # a job's image on its page (zoomed in the browser, not refetched)
THUMBNAIL_SIDE = 160  # a row of the results grid
MAX_SIDE = 4096


def owned_job(session: Session, job_id: str, caller: Caller) -> Job:
    """The job, if the caller may read it; another tenant's is as absent as a missing one."""
    key = _hex_id(job_id)
    job = reads.get_job(session, key) if key else None
    if job is None or not caller.may_read(job.tenant):
        raise NotFound(f"no job {job_id[:40]}", code="job_not_found")
    return job


def owned_batch(session: Session, batch_id: str, caller: Caller) -> Batch:
    key = _hex_id(batch_id)
    batch = reads.get_batch(session, key) if key else None
    if batch is None or not caller.may_read(batch.tenant):
        raise NotFound(f"no batch {batch_id[:40]}", code="batch_not_found")
    return batch


def _hex_id(text: str) -> str | None:
    try:
        return uuid.UUID(text).hex
    except ValueError:
        return None


def result_filter(params: Mapping[str, str]) -> ResultFilter:
    """A results filter from query parameters (``who``, ``status``, ``reason``, ``wrong``,
    ``disagree``, ``conf_min``, ``conf_max``, ``reviewed``, ``q``, ``sort``); empty ones
    are absent. A value that is not one of the field's is refused, naming the choices."""
    value = {name: text.strip() for name, text in params.items() if text and text.strip()}
    return ResultFilter(
        who=_choice(value, "who", WHO),
        status=_choice(value, "status", tuple(JobStatus)),
        reason=value.get("reason"),
        wrong=_flag(value, "wrong") or False,
        disagree=_flag(value, "disagree") or False,
        conf_min=_fraction(value, "conf_min"),
        conf_max=_fraction(value, "conf_max"),
        reviewed=_flag(value, "reviewed"),
        text=value.get("q"),
        sort=_choice(value, "sort", SORTS) or "position",
    )


def _choice(value: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str | None:
    if name in value and value[name] not in choices:
        raise InvalidInput(
            f"{name}={value[name][:40]!r}: choose one of {', '.join(choices)}",
            code="bad_filter",
        )
    return value.get(name)


def _flag(value: Mapping[str, str], name: str) -> bool | None:
    if name not in value:
        return None
    text = value[name].lower()
    if text not in ("1", "true", "yes", "0", "false", "no"):
        raise InvalidInput(f"{name}={text[:40]!r}: give yes or no (1 or 0)", code="bad_filter")
    return text in ("1", "true", "yes")


def _fraction(value: Mapping[str, str], name: str) -> float | None:
    if name not in value:
        return None
    try:
        number = float(value[name])
    except ValueError:
        number = -1.0
    if not 0.0 <= number <= 1.0:
        raise InvalidInput(
            f"{name}={value[name][:40]!r}: give a number from 0 to 1", code="bad_filter"
        )
    return number


def image_response(
    job: Job, settings: Settings, *, max_side: int | None = None, step: int | None = None
) -> Response:
    """The job's image (or, with ``step``, the crop an agent's zoom at that step returned),
    decoded and encoded anew, typed as decoded, never sniffed and never cached by another
    user's browser."""
    if not job.image_path:
        raise NotFound(f"job {job.id} has no image", code="image_not_found")
    box = None
    if step is not None:
        box = _zoom_box(job, step)
    side = None if max_side is None else max(16, min(max_side, MAX_SIDE))
    data, media_type = render_image(job.image_path, settings.images, max_side=side, box=box)
    return Response(
        data,
        media_type=media_type,
        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "private, max-age=300"},
    )


def _zoom_box(job: Job, step: int) -> list[int]:
    steps = (job.trajectory or {}).get("steps") or []
    if not 0 <= step < len(steps) or not steps[step].get("box_original"):
        raise NotFound(f"job {job.id} has no zoom at step {step}", code="step_not_found")
    box: list[int] = steps[step]["box_original"]
    return box


class ReviewSpec(BaseModel):
    """A person's answer for a finished job: an option's letter (or text) or free text."""

    answer: str = Field(description="the confirmed or corrected answer")


def review(session: Session, job: Job, spec: ReviewSpec, caller: Caller) -> Job:
    """Record the caller's review of ``job`` (``common.store.reviews``)."""
    return reviews.review_job(session, job, spec.answer, caller.name)


def review_fields(job: Job) -> dict[str, Any]:
    return {
        "reviewed_answer": job.reviewed_answer,
        "reviewer": job.reviewer,
        "reviewed_at": job.reviewed_at,
        "final_answer": job.given_answer,
    }
