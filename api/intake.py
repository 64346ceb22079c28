"""Turning what a request carries into a job the workers can run, within the limits.

A job arrives as multipart (an ``image`` file and form fields) or JSON (``JobSpec``); a
batch as JSON ``{name, jobs}`` or a JSONL body of jobs. An image arrives as bytes (a
multipart upload or base64) or as a server-side path. Bytes are checked (size, then
decoded: format, pixels) and kept in ``upload_dir`` under their content hash, so workers
on other machines read them from a shared folder. A path is accepted only inside one of
``image_roots`` after resolving symlinks, and checked the same way.

A single job that is wrong in any way is refused (413/422/403) and no job is created. In
a batch, what is wrong with one job stays with that job, as in ``annotate``: it becomes
a failed job carrying the code and reason its refusal would have had, and the rest of
the batch runs (``item_of_batch``). Only what is wrong with the request as a whole (not
JSON, no ``jobs`` list, too many jobs, the name) refuses the batch.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy.orm import Session, sessionmaker

from api.deps import Caller, too_many
from api.errors import ApiError, summary
from api.metrics import UNSENT
from api.quotas import check_quotas
from api.schemas import JobSpec
from common.config import Method, Settings
from common.contracts import JobStatus, Priority, SourceRow
from common.errors import ImageError, InvalidInput, RetryableError
from common.images import (
    PixelBudget,
    check_image,
    content_hash,
    image_suffix,
    keep_bytes,
    read_image_bytes,
)
from common.limits import OverLimit, check_id, check_name, check_query
from common.pipeline.dispatch import Dispatcher
from common.pipeline.notify import check_url
from common.sources.locations import is_reference
from common.store import reads, submission
from common.store.new_jobs import NewItem, storable_item

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredImage:
    path: str
    digest: str


def check_spec(spec: JobSpec, settings: Settings) -> None:
    """A job's texts within the limits every entry point shares (``common.limits``)."""
    limits = settings.requests
    check_query(spec.question, spec.options, limits)
    for field in ("id", "idempotency_key", "batch_id", "image_path", "answer"):
        value = getattr(spec, field)
        if value is not None:
            check_id(value, field, limits)


def image_from_bytes(data: bytes, settings: Settings) -> StoredImage:
    """Check uploaded bytes and keep them under ``upload_dir`` by content hash."""
    if len(data) > settings.api.max_upload_bytes:
        raise ApiError(
            413,
            "max_upload_bytes",
            f"the image has {len(data)} bytes; the limit (max_upload_bytes) is "
            f"{settings.api.max_upload_bytes}",
        )
    _decode(data, settings)
    path, digest = keep_bytes(data, settings.api.upload_dir, image_suffix(data))
    return StoredImage(path, digest)


def image_from_base64(text: str, settings: Settings) -> StoredImage:
    if len(text) > settings.api.max_upload_bytes * 4 // 3 + 4:
        raise ApiError(
            413,
            "max_upload_bytes",
            f"the image is over the limit (max_upload_bytes) of {settings.api.max_upload_bytes}",
        )
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(422, "image_base64_invalid", "image_base64 is not valid base64") from None
    return image_from_bytes(data, settings)


def image_from_path(path: str, settings: Settings) -> StoredImage:
    """A server-side file, accepted only inside ``image_roots``."""
    if not settings.api.image_roots:
        raise ApiError(
            403,
            "server_paths_disabled",
            "this server accepts no server-side image paths (image_roots is empty); "
            "upload the image instead",
        )
    if "://" in path or is_reference(path):  # the server fetches nothing for a client
        raise ApiError(
            422,
            "url_fetching_disabled",
            "image_path names a file of this server (under image_roots); URLs and other "
            "locators are not fetched: upload the image instead",
        )
    if ".." in Path(path).parts:
        raise ApiError(422, "path_traversal", "image_path may not contain '..'")
    resolved = Path(path).resolve()  # follows symlinks: a link out of the roots is refused
    roots = [root.expanduser().resolve() for root in settings.api.image_roots]
    if not any(resolved.is_relative_to(root) for root in roots):
        raise ApiError(
            403, "path_outside_roots", f"{path} is not inside an allowed folder (image_roots)"
        )
    try:
        data = read_image_bytes(resolved, settings.images)
    except ImageError as exc:
        _refuse_over_limit(exc)
        status = 404 if exc.code == "image_missing" else 422
        raise ApiError(status, exc.code, str(exc)) from None
    _decode(data, settings)
    return StoredImage(str(resolved), content_hash(data))


# An image over a size limit is a 413 whose code names the setting it broke.
_LIMIT_OF_CODE = {"image_too_large": "max_image_bytes", "image_too_many_pixels": "max_image_pixels"}


def _refuse_over_limit(exc: ImageError) -> None:
    limit_name = _LIMIT_OF_CODE.get(exc.code)
    if limit_name is not None:
        raise ApiError(413, limit_name, f"{exc} (the {limit_name} setting)") from None


# One budget per process (per setting): the uploads of every request share it.
_DECODE_BUDGETS: dict[int, PixelBudget] = {}


def decode_budget(settings: Settings) -> PixelBudget:
    """The process's budget of pixels decoded at once (uploads checked, images shown)."""
    limit = settings.api.decode_pixels
    return _DECODE_BUDGETS.setdefault(limit, PixelBudget(limit))


def _decode(data: bytes, settings: Settings) -> None:
    try:
        check_image(data, settings.images, decode_budget(settings))
    except ImageError as exc:
        _refuse_over_limit(exc)
        raise ApiError(422, "image_invalid", str(exc)) from None


# -- reading requests --------------------------------------------------------------------
JSONL_TYPES = ("application/x-ndjson", "application/jsonl", "application/json-lines")
Model = TypeVar("Model", bound=BaseModel)


async def read_job(request: Request, settings: Settings) -> tuple[JobSpec, StoredImage]:
    """A job request (multipart or JSON), its question checked and its image stored."""
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        form = await request.form(max_part_size=settings.api.max_upload_bytes + 1)
        upload = form.get("image")
        if upload is None or isinstance(upload, str):
            raise ApiError(422, "image_missing", "multipart field 'image' (a file) is required")
        data = await upload.read(settings.api.max_upload_bytes + 1)
        options = form.get("options")
        try:
            option_list = json.loads(str(options)) if options else None
        except (json.JSONDecodeError, RecursionError):
            raise ApiError(422, "invalid_request", "options must be a JSON list") from None
        fields = ("question", "idempotency_key", "batch_id", "id", "priority", "callback_url")
        given = {field: form.get(field) for field in fields if field in form}
        spec = validated(JobSpec, {"options": option_list, **given})
        check_spec(spec, settings)
        stored = await run_in_threadpool(image_from_bytes, data, settings)
        return spec, stored
    spec = validated(JobSpec, await read_json(request))
    return spec, await run_in_threadpool(store_image, spec, settings)


class _BatchEnvelope(BaseModel):
    """A batch request before its jobs are looked at (each is checked on its own)."""

    name: str | None = None
    jobs: list[Any]
    priority: Priority | None = None  # (JSONL: ?priority=)
    # a failure budget (common.store.budgets; JSONL: the same names as query parameters)
    max_failure_rate: float | None = Field(None, ge=0.0, le=1.0)
    failure_budget_after: int | None = Field(None, ge=1)
    callback_url: str | None = None  # where its events go (JSONL: ?callback_url=)

    def budget(self) -> tuple[float, int | None] | None:
        if self.max_failure_rate is None:
            if self.failure_budget_after is not None:
                raise ApiError(
                    422, "invalid_request", "failure_budget_after needs max_failure_rate"
                )
            return None
        return self.max_failure_rate, self.failure_budget_after


async def read_batch(request: Request, settings: Settings) -> _BatchEnvelope:
    """A batch request: JSON ``{name, jobs}`` or JSONL jobs (``?name=``), within limits;
    its jobs as sent (``item_of_batch`` checks each)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip()
    if content_type in JSONL_TYPES:
        body = (await request.body()).decode("utf-8", errors="replace")
        jobs = []
        for number, line in enumerate(body.splitlines(), 1):
            if line.strip():
                try:
                    jobs.append(json.loads(line))
                except (json.JSONDecodeError, RecursionError) as exc:
                    # that row fails alone, as a bad job of a JSON batch does
                    jobs.append(UnreadableLine(number, getattr(exc, "msg", "nested too deep")))
        query = request.query_params
        names = ("name", "priority", "max_failure_rate", "failure_budget_after", "callback_url")
        fields = {name: query.get(name) for name in names} | {"jobs": jobs}
        batch = validated(_BatchEnvelope, fields)
    else:
        batch = validated(_BatchEnvelope, await read_json(request))
    if batch.name is not None:
        check_name(batch.name, settings.requests)
    if len(batch.jobs) > settings.api.max_batch_jobs:
        raise ApiError(
            413,
            "max_batch_jobs",
            f"{len(batch.jobs)} jobs; the limit (max_batch_jobs) is {settings.api.max_batch_jobs}",
        )
    return batch


async def read_json(request: Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(422, "invalid_json", f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise ApiError(422, "invalid_json", "the body's JSON is nested too deep") from None


def validated(model: type[Model], data: Any) -> Model:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ApiError(422, "invalid_request", summary(exc.errors())) from None


def store_image(spec: JobSpec, settings: Settings) -> StoredImage:
    """A JSON job's image (base64 or a server-side path), checked and kept."""
    check_spec(spec, settings)
    if spec.image_url is not None:
        raise ApiError(
            422, "url_fetching_disabled", "this server fetches no URLs; upload the image"
        )
    if (spec.image_base64 is None) == (spec.image_path is None):
        raise ApiError(422, "image_missing", "give exactly one of image_base64 or image_path")
    if spec.image_base64 is not None:
        return image_from_base64(spec.image_base64, settings)
    return image_from_path(spec.image_path or "", settings)


@dataclass(frozen=True)
class UnreadableLine:
    """A line of a JSONL batch that is not JSON: its row fails alone (``invalid_jsonl``)."""

    number: int
    why: str


def checked_callback(url: str, settings: Settings) -> str:
    """A callback URL deliveries may go to, or a 422 that says why not (malformed:
    ``invalid_callback_url``; this side of the network: ``callback_url_refused``)."""
    return check_url(url, settings.webhooks.allow_hosts)


def item_of_batch(raw: Any, position: int, settings: Settings) -> NewItem:
    """One job of a batch as the store's item: checked, its image kept; or, whatever is
    wrong with it, a failed item with the code and reason a request of that job alone
    would have been refused with."""
    if isinstance(raw, UnreadableLine):
        row = SourceRow(position, str(position), "", None, image_path=None)
        error = ("invalid_jsonl", f"line {raw.number}: {raw.why}")
        return replace(storable_item(row, settings.requests), error=error)
    try:
        spec = validated(JobSpec, raw)
        if spec.callback_url is not None:
            raise ApiError(
                422,
                "invalid_request",
                "a job of a batch has no callback_url of its own: the batch's callback_url "
                "is told when the batch ends",
            )
        return new_item(spec, store_image(spec, settings), position, spec.id or str(position))
    except ApiError as exc:
        error = (exc.error, exc.detail)
    except OverLimit as exc:
        error = (exc.setting, exc.message)
    except InvalidInput as exc:
        error = (exc.code, exc.message)
    fields = raw if isinstance(raw, dict) else {}

    def text(name: str) -> str | None:
        value = fields.get(name)
        return value if isinstance(value, str) else None

    options = fields.get("options")
    row = SourceRow(
        position,
        text("id") or str(position),
        text("question") or "",
        [str(option) for option in options] if isinstance(options, list) else None,
        # never the path the request named: it was refused (outside the image roots, or
        # not there), and a stored path is one the image routes would serve
        image_path=None,
        expected=text("answer"),
    )
    return replace(storable_item(row, settings.requests), error=error)


def new_item(spec: JobSpec, image: StoredImage, position: int, item_id: str) -> NewItem:
    """The store's view of one requested job."""
    return NewItem(
        position,
        item_id,
        spec.question,
        spec.options,
        image.path,
        image.digest,
        expected=spec.answer,
    )


def enqueue_job(
    sessions: sessionmaker[Session],
    dispatcher: Dispatcher,
    item: NewItem,
    caller: Caller,
    settings: Settings,
    *,
    client_key: str | None = None,
    batch_id: str | None = None,
    callback_url: str | None = None,
    method: Method | None = None,
) -> submission.SubmittedJob:
    """One job committed (or the one ``client_key`` names found), then sent to its stage;
    within the caller's jobs in flight. ``method``: the server's (``funnel.method``)
    unless named."""

    def create() -> submission.SubmittedJob:
        with dispatcher.transaction(sessions, on_send_error=unsent) as outbox:
            job = submission.submit_job(
                outbox.session,
                item,
                client_key=client_key,
                batch_id=batch_id,
                tenant=caller.tenant,
                method=method or settings.funnel.method,
                callback_url=callback_url,
            )
            if job.created:
                check_in_flight(outbox.session, caller, settings, adding=1)
            # a retry sends a waiting job again: its first message may never have left
            # (a duplicate message changes nothing)
            if job.status == JobStatus.QUEUED:
                outbox.to_fast([job.id])
            elif job.status == JobStatus.DEFERRED:
                outbox.to_slow([job.id])
        return job

    return submission.resolving_races(create)


def parse_id(value: str, field: str) -> str:
    """An id given in a body (32 hex digits, or a UUID in any form) as the store keeps it."""
    try:
        return uuid.UUID(value).hex
    except ValueError:
        raise ApiError(422, "invalid_request", f"{field}: not an id ({value!r})") from None


def check_in_flight(session: Session, caller: Caller, settings: Settings, adding: int) -> None:
    """Refuse (429) work that would take the caller's tenant over its unfinished jobs, or
    past a daily quota (``api.quotas``). Called inside the creating transaction, after
    its jobs were added, so they count (and a refusal keeps nothing of them)."""
    limit = settings.api.max_jobs_in_flight
    if not adding or caller.tenant is None:
        return
    check_quotas(session, caller, settings, adding)
    unfinished = reads.unfinished_jobs(session, caller.tenant)
    if unfinished > limit:
        raise too_many(
            "max_jobs_in_flight",
            f"{unfinished - adding} unfinished jobs and {adding} new; the "
            f"limit (api_max_jobs_in_flight) is {limit} per tenant",
            5.0,
        )


def public_path(path: str | None, upload_root: Path) -> str | None:
    """What a client may see of a job's image path: the server path it named itself (inside
    ``image_roots``), never where an upload is kept (``upload_root``, resolved)."""
    if path is None or Path(path).resolve().is_relative_to(upload_root):
        return None
    return path


def unsent(error: RetryableError) -> None:
    """A committed job the broker would not take now: the answer is still 202, and the
    reconciler sends it once the broker is back (``common.pipeline.reconcile``)."""
    UNSENT.inc()
    log.warning("committed, not sent (the reconciler will send it): %s", error)
