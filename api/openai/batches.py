"""``/openai/v1/batches``: a batch made from an uploaded file of chat requests, read in
OpenAI's vocabulary, listed, cancelled.

Creating one reads every line of its file: a line that is wrong in any way (not JSON,
no ``custom_id``, another endpoint, another model than the batch's, a refused request, a
broken image) becomes a failed job with its code and reason, listed in the error file;
the rest runs. It is one of our batches, named ``openai <filename>``: ``/ui`` and
``GET /v1/batches`` show it. Past its completion window what has not finished is
cancelled (``expired``) and what has is kept, within seconds: every API process checks
the windows (``common.pipeline.windows``), the workers' reconciler too, and every look at
the batch (``common.store.openai_batches.expire_due``). Cancelling an ended batch
changes nothing; two lines with one custom_id refuse the batch (its output could not
tell them apart).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field, field_validator
from sqlalchemy.orm import Session

from api.browse import owned_batch
from api.deps import Caller, CallerDep, DispatcherDep, SessionsDep, SettingsDep
from api.errors import ApiError
from api.intake import StoredImage, check_in_flight, unsent
from api.openai import output
from api.openai.files import owned_file, request_lines, stored_image
from api.openai.requests import Asked, item_of, model_names, read_chat
from common.config import Method, Settings
from common.contracts import Priority, SourceRow
from common.errors import InvalidInput, NotFound
from common.limits import OverLimit, check_id
from common.pipeline.dispatch import send_waiting
from common.store import openai_batches, reads, submission
from common.store.new_jobs import NewItem, storable_item
from common.store.openai_tables import OpenAIBatch
from common.store.tables import Batch

router = APIRouter(prefix="/batches", tags=["openai"])

ENDPOINT = "/v1/chat/completions"
LONGEST_WINDOW = timedelta(hours=24)
_WINDOW = re.compile(r"^([1-9][0-9]{0,5})([smh])$")


class BatchSpec(BaseModel):
    input_file_id: str = Field(max_length=60)
    endpoint: str = Field(max_length=100)
    completion_window: str = Field(max_length=16)
    metadata: dict[str, str] | None = Field(
        None, description="at most 16 pairs: keys of 64 characters, values of 512 (OpenAI's)"
    )

    @field_validator("metadata")
    @classmethod
    def _bounded(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None and (
            len(value) > 16
            or any(len(key) > 64 or len(text) > 512 for key, text in value.items())
            or any("\x00" in key + text for key, text in value.items())
        ):
            raise ValueError("at most 16 pairs, keys of 64 characters, values of 512")
        return value


@router.post("", summary="Make a batch of an uploaded file's chat requests")
async def create_batch(
    spec: BatchSpec,
    caller: CallerDep,
    settings: SettingsDep,
    sessions: SessionsDep,
    dispatcher: DispatcherDep,
) -> dict[str, Any]:
    if spec.endpoint != ENDPOINT:
        raise ApiError(
            400, "endpoint_unsupported", f"endpoint {spec.endpoint[:100]!r}: only {ENDPOINT}"
        )
    window = _window(spec.completion_window)
    with sessions() as session:
        source = owned_file(session, spec.input_file_id, caller)
        path, filename = source.path, source.filename
    rank = caller.priority(None, Priority.NORMAL)
    uploaded = partial(stored_image, sessions, caller)
    model, items = await run_in_threadpool(_items, path, settings, rank, uploaded)

    def create() -> str:
        with dispatcher.transaction(sessions, on_send_error=unsent) as outbox:
            made = submission.submit_batch(
                outbox.session,
                items,
                name=f"openai {filename}"[:200],
                client_key=None,
                tenant=caller.tenant,
                method=_method_of(model, settings),
                own_jobs=True,
            )
            check_in_flight(outbox.session, caller, settings, adding=len(made.queued))
            openai_batches.record_batch(
                outbox.session,
                made.id,
                input_file_id=spec.input_file_id,
                endpoint=ENDPOINT,
                completion_window=spec.completion_window,
                window=window,
                model=model,
                meta=spec.metadata,
            )
            send_waiting(outbox, made.id)
            return made.id

    batch_id = await run_in_threadpool(create)
    with sessions() as session:
        return _view(session, batch_id)


@router.get("/{batch_id}", summary="A batch: its status, request counts and files")
def get_batch(batch_id: str, caller: CallerDep, sessions: SessionsDep) -> dict[str, Any]:
    with sessions.begin() as session:
        batch = _owned(session, batch_id, caller)
        openai_batches.expire_due(session, [batch.id])
    with sessions() as session:
        return _view(session, batch.id)


@router.post("/{batch_id}/cancel", summary="Cancel what has not finished (what has is kept)")
def cancel_batch(batch_id: str, caller: CallerDep, sessions: SessionsDep) -> dict[str, Any]:
    with sessions.begin() as session:
        batch = _owned(session, batch_id, caller)
        openai_batches.expire_due(session, [batch.id])
        row = session.get(OpenAIBatch, batch.id)
        assert row is not None  # (_owned checked)
        openai_batches.cancel(session, row)
    with sessions() as session:
        return _view(session, batch.id)


@router.get("", summary="Your OpenAI batches, newest first")
def list_batches(
    caller: CallerDep,
    sessions: SessionsDep,
    after: str | None = Query(None, max_length=60),
    limit: int = Query(20, ge=1, le=100),
) -> dict[str, Any]:
    try:
        last = _batch_key(after) if after else None
    except ApiError:
        raise ApiError(400, "invalid_cursor", "after: the id of a batch of a page") from None
    with sessions.begin() as session:
        found = openai_batches.batches_of(session, caller.tenant, caller.admin, last, limit + 1)
        openai_batches.expire_due(session, [batch.id for batch, _ in found[:limit]])
    with sessions() as session:
        data = [_view(session, batch.id) for batch, _ in found[:limit]]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(found) > limit,
    }


def _window(text: str) -> timedelta:
    """A completion window: OpenAI's "24h", or a shorter one ("30m", "90s")."""
    found = _WINDOW.match(text)
    seconds = int(found[1]) * {"s": 1, "m": 60, "h": 3600}[found[2]] if found else 0
    if not found or timedelta(seconds=seconds) > LONGEST_WINDOW:
        raise ApiError(
            400,
            "completion_window_unsupported",
            f"completion_window {text[:16]!r}: '24h', or shorter as '30m' or '90s'",
        )
    return timedelta(seconds=seconds)


@dataclass(frozen=True)
class _Request:
    """A line of the file, read: its request, or the code and reason it is refused. A
    line with no usable custom_id has "" (which no caller's can be: the error file then
    says null, and its message names the line)."""

    custom_id: str
    asked: Asked | None = None
    error: tuple[str, str] | None = None


def _items(
    path: str, settings: Settings, rank: int, uploaded: Callable[[str], StoredImage]
) -> tuple[str, list[NewItem]]:
    """The batch's model (its first readable request's) and a job's item per line: its
    request, or a failed item that says why. Two lines with one custom_id refuse the
    batch (400 ``duplicate_custom_id``): its output could not say which was which."""
    with open(path, encoding="utf-8-sig") as kept:
        lines = request_lines(kept.read())
    requests = [_line(text, number, settings) for number, text in lines]
    _refuse_duplicates(requests, [number for number, _ in lines])
    model = next((one.asked.model for one in requests if one.asked is not None), "")
    items = []
    for position, one in enumerate(requests):
        if one.asked is not None and one.asked.model != model:
            why = f"model {one.asked.model}: the batch's is {model} (one model a batch)"
            one = _Request(one.custom_id, error=("model_mismatch", why))
        items.append(_item(one, position, settings, rank, uploaded))
    return model, items


def _line(text: str, number: int, settings: Settings) -> _Request:
    """Line ``number`` of the file (blank lines counted) read."""
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        why = f"line {number}: not JSON ({getattr(exc, 'msg', 'nested too deep')})"
        return _Request("", error=("invalid_jsonl", why))
    line = raw if isinstance(raw, dict) else {}
    custom_id = line.get("custom_id")
    try:
        if not isinstance(custom_id, str) or not custom_id.strip():
            raise InvalidInput("custom_id must be a non-empty string", code="invalid_custom_id")
        check_id(custom_id, "custom_id", settings.requests)
    except (InvalidInput, OverLimit) as exc:
        return _Request("", error=("invalid_custom_id", f"line {number}: {exc}"))
    if line.get("method") != "POST" or line.get("url") != ENDPOINT:
        why = f"line {number}: method and url must be POST {ENDPOINT}"
        return _Request(custom_id, error=("url_unsupported", why))
    try:
        return _Request(custom_id, asked=read_chat(line.get("body"), settings))
    except ApiError as exc:
        return _Request(custom_id, error=(exc.error, f"line {number}: {exc.detail}"))
    except OverLimit as exc:
        return _Request(custom_id, error=(exc.setting, f"line {number}: {exc.message}"))
    except InvalidInput as exc:
        return _Request(custom_id, error=(exc.code, f"line {number}: {exc.message}"))


def _refuse_duplicates(requests: list[_Request], numbers: list[int]) -> None:
    first: dict[str, int] = {}
    for one, number in zip(requests, numbers, strict=True):
        if not one.custom_id:
            continue
        if one.custom_id in first:
            raise ApiError(
                400,
                "duplicate_custom_id",
                f"lines {first[one.custom_id]} and {number} have the custom_id "
                f"{one.custom_id[:80]!r}: each request needs its own",
            )
        first[one.custom_id] = number


def _item(
    one: _Request,
    position: int,
    settings: Settings,
    rank: int,
    uploaded: Callable[[str], StoredImage],
) -> NewItem:
    error = one.error
    if one.asked is not None:
        try:
            return item_of(one.asked, position, one.custom_id, settings, rank, uploaded)
        except ApiError as exc:  # (its image: broken, too large, not fetched)
            error = (exc.error, exc.detail)
    row = SourceRow(position, one.custom_id, "", None, image_path=None)
    return replace(storable_item(row, settings.requests), error=error)


def _method_of(model: str, settings: Settings) -> Method:
    return model_names(settings).get(model, settings.funnel.method)


def _owned(session: Session, batch_id: str, caller: Caller) -> Batch:
    """The caller's OpenAI batch (``batch_<id>``); anything else is a 404."""
    try:
        batch = owned_batch(session, _batch_key(batch_id), caller)
    except NotFound:
        batch = None
    if batch is None or session.get(OpenAIBatch, batch.id) is None:
        raise ApiError(404, "batch_not_found", f"no batch {batch_id[:60]}")
    return batch


_BATCH_ID = re.compile(r"batch_([0-9a-f]{32})")


def _batch_key(batch_id: str) -> str:
    """Our batch's id in an OpenAI batch id (``batch_<32 hex>``); a 404 for any other."""
    found = _BATCH_ID.fullmatch(batch_id)
    if found is None:
        raise ApiError(404, "batch_not_found", f"no batch {batch_id[:60]!r}")
    return found[1]


def _view(session: Session, batch_id: str) -> dict[str, Any]:
    """The batch as OpenAI's ``Batch`` object."""
    batch = session.get(Batch, batch_id)
    row = session.get(OpenAIBatch, batch_id)
    assert batch is not None and row is not None
    requests = openai_batches.requests_of(session, batch_id)
    status = openai_batches.status_of(row, requests)
    ended = not requests.unfinished
    files = output.file_ids(batch_id)
    finished_at = reads.batch_counts(session, batch_id).last_finished if ended else None
    return {
        "id": f"batch_{batch_id}",
        "object": "batch",
        "endpoint": row.endpoint,
        "model": row.model,
        "errors": None,
        "input_file_id": row.input_file_id,
        "completion_window": row.completion_window,
        "status": status,
        "output_file_id": files["output"] if ended and requests.done else None,
        "error_file_id": files["errors"] if ended and requests.failed else None,
        "created_at": _seconds(batch.created_at),
        "in_progress_at": _seconds(batch.created_at),
        "expires_at": _seconds(row.expires_at),
        "finalizing_at": None,
        "completed_at": _seconds(finished_at) if status == "completed" else None,
        "failed_at": None,
        "expired_at": _seconds(row.expired_at),
        "cancelling_at": _seconds(row.cancelled_at),
        "cancelled_at": _seconds(finished_at or row.cancelled_at)
        if status == "cancelled"
        else None,
        "request_counts": {
            "total": requests.total,
            "completed": requests.done,
            "failed": requests.failed,
        },
        "metadata": row.meta,
    }


def _seconds(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp())
