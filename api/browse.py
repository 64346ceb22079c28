"""What the /v1 routes and the review pages (``api.ui``) share: another tenant's work as
absent as a missing one, a results filter read from a query string, a job's image as a
person is shown it, and a review.

The pages and the API call these same functions (and, below them, the same store
functions), so what a page shows or changes is what /v1 shows or changes.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

from fastapi import Query, Response
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from api.deps import Caller
from api.errors import ApiError
from api.intake import decode_budget
from common.config import Settings
from common.contracts import JobStatus
from common.errors import ImageError, InvalidInput, NotFound
from common.images import content_hash, render_image
from common.limits import check_text
from common.sources.locations import is_local_file
from common.sources.reading import read_located
from common.store import reviews
from common.store.browse import SORTS, WHO, ResultFilter
from common.store.listing import MOST_PER_PAGE, Window
from common.store.tables import Batch, Job, as_utc

log = logging.getLogger(__name__)
Row = TypeVar("Row", Job, Batch)

PREVIEW_SIDE = 1600  # a job's image on its page (zoomed in the browser, not refetched)
THUMBNAIL_SIDE = 160  # a row of the results grid
# The sizes an image is rendered at: a request's max_side is rounded up to one of them, so
# renders are few and kept (a size per request would make every request a new render).
SIDES = (THUMBNAIL_SIDE, 480, 800, PREVIEW_SIDE, 4096)
RENDERS_AT_ONCE = 2  # decoding is CPU and memory: a few at a time, the rest wait briefly
RENDER_WAIT_S = 10.0


def owned_job(session: Session, job_id: str, caller: Caller) -> Job:
    """The job, if the caller may read it; another tenant's is as absent as a missing one."""
    return _owned(session, Job, job_id, caller)


def owned_batch(session: Session, batch_id: str, caller: Caller) -> Batch:
    """The batch, if the caller may read it (as ``owned_job``)."""
    return _owned(session, Batch, batch_id, caller)


def _owned(session: Session, table: type[Row], text: str, caller: Caller) -> Row:
    key = _hex_id(text)
    row = session.get(table, key) if key else None
    if row is None or not caller.may_read(row.tenant):
        kind = "job" if table is Job else "batch"
        raise NotFound(f"no {kind} {text[:40]}", code=f"{kind}_not_found")
    return row


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
    for name, text in value.items():
        check_text(text, name)  # a NUL or a lone surrogate: 422, never a database error
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
    job: Job,
    settings: Settings,
    *,
    max_side: int | None = None,
    step: int | None = None,
    small: bool = False,
) -> Response:
    """The job's image (or, with ``step``, the crop an agent's zoom at that step returned;
    with ``small`` too, the small model's zoom before the gate), decoded and encoded anew,
    typed as decoded, never sniffed. An image that cannot be read is a 404 that names no
    path (the reason goes to the log)."""
    if not job.image_path:
        raise NotFound(f"job {job.id} has no image", code="image_not_found")
    box = None if step is None else _zoom_box(job, step, small)
    side = None if max_side is None else next((s for s in SIDES if s >= max_side), SIDES[-1])
    if job.tenant is not None and not _accepted_path(job.image_path, settings):
        # a tenant's job holds an upload or a file under image_roots; anything else (a
        # path an older version kept for a refused job, a root since removed) is not served
        log.warning("job %s: its image path is outside the uploads and image roots", job.id)
        raise NotFound(f"job {job.id}'s image cannot be shown", code="image_unavailable")
    try:
        data, media_type = _rendered(job.image_path, settings, side, box, job.image_hash)
    except ImageError as exc:
        log.warning("job %s: its image cannot be shown: %s", job.id, exc)
        raise NotFound(
            f"job {job.id}'s image cannot be read now (moved, removed or damaged)",
            code="image_unavailable",
        ) from None
    return Response(
        data,
        media_type=media_type,
        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "private, max-age=300"},
    )


# Rendered images kept by file (and its mtime), size and box: a results grid asks for
# 50 thumbnails a page, and a page is often seen again. Bounded by bytes held.
_RENDERED: OrderedDict[tuple[Any, ...], tuple[bytes, str]] = OrderedDict()
_RENDERED_MAX_BYTES = 32 * 1024 * 1024
_rendered_bytes = 0  # the bytes _RENDERED holds
_rendered_lock = threading.Lock()
_render_slots = threading.BoundedSemaphore(RENDERS_AT_ONCE)


def _accepted_path(path: str, settings: Settings) -> bool:
    """Whether ``path`` lies in the upload folder or an image root (symlinks resolved)."""
    if not is_local_file(path):
        return False
    where = Path(path).resolve()
    roots = [settings.api.upload_dir, *settings.api.image_roots]
    return any(where.is_relative_to(root.expanduser().resolve()) for root in roots)


def _rendered(
    path: str,
    settings: Settings,
    side: int | None,
    box: list[int] | None,
    digest: str | None = None,
) -> tuple[bytes, str]:
    if is_local_file(path):
        try:
            stat = os.stat(path)
        except OSError:
            raise ImageError("the image file is not there") from None
        version: tuple[int | str | None, ...] = (stat.st_mtime_ns, stat.st_size)
    else:  # a tar member, a table row, an object: what the job read, by its digest
        version = (digest,)
    key = (path, *version, side, tuple(box) if box else None)
    with _rendered_lock:
        if key in _RENDERED:
            _RENDERED.move_to_end(key)
            return _RENDERED[key]
    if not _render_slots.acquire(timeout=RENDER_WAIT_S):
        raise ApiError(
            503,
            "images_busy",
            "every image renderer is busy: retry in a moment",
            {"Retry-After": "2"},
        )
    try:
        data = read_located(path, settings.images)
        if not is_local_file(path) and digest is not None and content_hash(data) != digest:
            raise ImageError("the image changed since its job was submitted")
        found = render_image(
            data, settings.images, max_side=side, box=box, budget=decode_budget(settings)
        )
    finally:
        _render_slots.release()
    global _rendered_bytes
    with _rendered_lock:
        if key not in _RENDERED:
            _RENDERED[key] = found
            _rendered_bytes += len(found[0])
        while _rendered_bytes > _RENDERED_MAX_BYTES:
            _rendered_bytes -= len(_RENDERED.popitem(last=False)[1][0])
    return found


def _zoom_box(job: Job, step: int, small: bool) -> list[int]:
    """The box a zoom at ``step`` cut from the original, if it is one."""
    box = zoom_box_of(job, step, small=small)
    if box is None:
        raise NotFound(f"job {job.id} has no zoom at step {step}", code="step_not_found")
    return box


def zoom_box_of(job: Job, step: int, *, small: bool = False) -> list[int] | None:
    """The box [x1, y1, x2, y2] an agent's zoom at ``step`` cut from the original image
    (``small``: the small model's, before the gate), where the steps hold one (four
    integers), else None."""
    steps = (job.small_steps if small else job.trace_steps) or []
    found = steps[step].get("box_original") if 0 <= step < len(steps) else None
    if isinstance(found, list) and len(found) == 4 and all(type(v) is int for v in found):
        return found
    return None


class ReviewSpec(BaseModel):
    """A person's answer for a finished job: an option's letter (or text) or free text."""

    answer: str = Field(description="the confirmed or corrected answer")


def review(session: Session, job: Job, spec: ReviewSpec, caller: Caller) -> Job:
    """Record the caller's review of ``job`` (``common.store.reviews``)."""
    return reviews.review_job(session, job, spec.answer, caller.name)


# a listing's query parameters, shared by GET /v1/batches and GET /v1/jobs
After = Annotated[str | None, Query(description="the next_cursor of the previous page")]
Limit = Annotated[int, Query(ge=1, le=MOST_PER_PAGE, description="rows a page at most")]
CreatedFrom = Annotated[datetime | None, Query(description="made at or after (ISO 8601)")]
CreatedTo = Annotated[datetime | None, Query(description="made before (ISO 8601)")]


def window(
    caller: Caller,
    after: str | None,
    limit: int,
    created_from: datetime | None,
    created_to: datetime | None,
) -> Window:
    """The rows a listing may show ``caller``: its tenant's (every tenant's for an admin,
    or where keys are off), made in the range given, a page after ``after``."""
    return Window(
        caller.tenant,
        everyone=caller.admin,
        after=after,
        limit=limit,
        created_from=None if created_from is None else as_utc(created_from),
        created_to=None if created_to is None else as_utc(created_to),
    )
