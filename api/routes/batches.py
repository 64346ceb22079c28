"""``/v1/batches``: submit many jobs at once, follow the batch, stream its results, list
them filtered a page at a time, read its review queue, and cancel, resume or retry it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import replace

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session, sessionmaker

from api.browse import After, CreatedFrom, CreatedTo, Limit, owned_batch, result_filter, window
from api.deps import Caller, CallerDep, DispatcherDep, SessionsDep, SettingsDep
from api.intake import (
    JSONL_TYPES,
    check_in_flight,
    checked_callback,
    item_of_batch,
    public_path,
    read_batch,
    unsent,
)
from api.metrics import SUBMITTED, TENANT_SUBMITTED
from api.quotas import quotas_of
from api.schemas import (
    BatchesPage,
    BatchLineView,
    BatchSubmitted,
    BatchView,
    CancelView,
    ItemRefused,
    JobSpec,
    RequeuedView,
    RowsPage,
    RowView,
)
from common.contracts import Priority
from common.errors import InvalidInput
from common.logs import job_failed
from common.pipeline import cancel
from common.pipeline.audit import figures
from common.pipeline.dispatch import send_waiting
from common.store import reads, reviews, submission
from common.store.browse import PAGE_ROWS, BadCursor, results_page
from common.store.export import result_row
from common.store.listing import batches_page
from common.store.overview import overview_once_finished

router = APIRouter(prefix="/batches", tags=["batches"])


_BATCH_BODY = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "priority": {"enum": ["high", "normal", "low"], "description": "default normal"},
        "max_failure_rate": {
            "type": "number",
            "description": "a failure budget: once failure_budget_after jobs finished (10 "
            "if not given), a failed share over this cancels the rest (failure_budget)",
        },
        "failure_budget_after": {"type": "integer"},
        "callback_url": {
            "type": "string",
            "description": "where the batch's events are posted (batch.finished, "
            "batch.cancelled, audit.alarm), signed with your callback secret",
        },
        "jobs": {"type": "array", "items": JobSpec.model_json_schema()},
    },
    "required": ["jobs"],
}


@router.post(
    "",
    status_code=202,
    response_model=BatchSubmitted,
    openapi_extra={
        "requestBody": {
            "content": {
                "application/json": {"schema": _BATCH_BODY},
                JSONL_TYPES[0]: {"schema": JobSpec.model_json_schema()},
            }
        }
    },
    summary="Submit many jobs: JSON {name, jobs: [...]} or a JSONL body of jobs. A job that "
    "is wrong fails alone (listed in 'refused'); the batch is accepted",
)
async def submit_batch(
    request: Request,
    caller: CallerDep,
    settings: SettingsDep,
    sessions: SessionsDep,
    dispatcher: DispatcherDep,
) -> BatchSubmitted:
    batch = await read_batch(request, settings)
    rank = caller.priority(batch.priority, Priority.NORMAL)
    budget = batch.budget()
    callback = (
        None if batch.callback_url is None else checked_callback(batch.callback_url, settings)
    )
    items = await run_in_threadpool(
        lambda: [
            replace(item_of_batch(job, position, settings), priority=rank)
            for position, job in enumerate(batch.jobs)
        ]
    )
    client_key = request.headers.get("idempotency-key")

    def create() -> submission.SubmittedBatch:
        with dispatcher.transaction(sessions, on_send_error=unsent) as outbox:
            submitted = submission.submit_batch(
                outbox.session,
                items,
                name=batch.name or "api",
                client_key=client_key,
                tenant=caller.tenant,
                method=settings.funnel.method,
                budget=budget,
                callback_url=callback,
            )
            if submitted.created:
                check_in_flight(outbox.session, caller, settings, adding=len(submitted.queued))
            # (a retry sends what still waits again: a duplicate message changes nothing)
            send_waiting(outbox, submitted.id)
        return submitted

    submitted = await run_in_threadpool(submission.resolving_races, create)
    SUBMITTED.labels("batches").inc(len(submitted.queued))
    TENANT_SUBMITTED.labels(caller.tenant or "").inc(len(submitted.queued))
    # A retry (the Idempotency-Key named a batch made before) made nothing: its jobs were
    # listed and logged the first time, and this request may not be the same.
    refused = [
        ItemRefused(
            index=item.position,
            id=item.item_id,
            job_id=job_id,
            error=item.error[0],
            detail=item.error[1],
        )
        for item, job_id in (
            zip(items, submitted.job_ids, strict=True) if submitted.created else ()
        )
        if item.error is not None
    ]
    for item in refused:
        job_failed(item.job_id, "intake", item.error, item.detail)
    return BatchSubmitted(
        id=submitted.id, job_ids=submitted.job_ids, created=submitted.created, refused=refused
    )


@router.get(
    "",
    response_model=BatchesPage,
    summary="Your batches, newest first, a page at a time (filters: name, created range)",
)
def list_batches(
    caller: CallerDep,
    sessions: SessionsDep,
    after: After = None,
    limit: Limit = 50,
    name: str | None = Query(None, max_length=200, description="only batches of this name"),
    created_from: CreatedFrom = None,
    created_to: CreatedTo = None,
) -> BatchesPage:
    cut = window(caller, after, limit, created_from, created_to)
    with sessions() as session:
        lines, cursor = batches_page(session, cut, name=name)
    return BatchesPage(data=[BatchLineView.of(line) for line in lines], next_cursor=cursor)


@router.get("/{batch_id}", response_model=BatchView, summary="Counts, beta, alpha")
def get_batch(
    batch_id: uuid.UUID, caller: CallerDep, settings: SettingsDep, sessions: SessionsDep
) -> BatchView:
    with sessions() as session:
        batch = owned_batch(session, batch_id.hex, caller)
        audit = {**figures(session, settings, batch.id).as_dict(), "alarm": batch.audit_alarm}
        counts = reads.batch_counts(session, batch.id)
        found = overview_once_finished(sessions, session, batch.id, counts)
        price = settings.accounting.price_per_gpu_hour
        usage = None if found is None else found.usage.to_dict(price)
        return BatchView.of(batch, counts, audit, usage)


@router.get("/{batch_id}/results", summary="A batch's results, streamed as JSONL")
def get_results(
    batch_id: uuid.UUID, caller: CallerDep, settings: SettingsDep, sessions: SessionsDep
) -> StreamingResponse:
    with sessions() as session:
        found = owned_batch(session, batch_id.hex, caller).id

    uploads = settings.api.upload_dir.resolve()

    def rows() -> Iterator[bytes]:
        with sessions() as session:
            for item, job in reads.batch_results(session, found):
                row = {**result_row(item, job), "image": public_path(job.image_path, uploads)}
                yield (json.dumps(row, default=str) + "\n").encode()

    return StreamingResponse(rows(), media_type="application/x-ndjson")


@router.get(
    "/{batch_id}/rows",
    response_model=RowsPage,
    summary="A page of the batch's results, filtered (who, status, reason, wrong, disagree, "
    "conf_min, conf_max, reviewed, q) and sorted (sort=position|confidence|-confidence); "
    "next_cursor goes back as ?after=",
)
def get_rows(
    batch_id: uuid.UUID,
    request: Request,
    caller: CallerDep,
    sessions: SessionsDep,
    after: str | None = None,
    limit: int = Query(PAGE_ROWS, ge=1, le=500),
) -> RowsPage:
    params = {k: v for k, v in request.query_params.items() if k not in ("after", "limit")}
    wanted = result_filter(params)
    with sessions() as session:
        batch = owned_batch(session, batch_id.hex, caller)
        try:
            page = results_page(session, batch.id, wanted, after=after, limit=limit)
        except BadCursor as exc:
            raise InvalidInput(str(exc), code="bad_cursor") from None
        rows = [RowView.of(row.item, row.job, row.correct) for row in page.rows]
        return RowsPage(data=rows, next_cursor=page.next_cursor)


@router.get(
    "/{batch_id}/review-queue",
    response_model=RowsPage,
    summary="The batch's unreviewed answers most worth a look: audit disagreements, then "
    "accepted answers closest to tau, then failures",
)
def get_review_queue(
    batch_id: uuid.UUID,
    caller: CallerDep,
    sessions: SessionsDep,
    limit: int = Query(PAGE_ROWS, ge=1, le=500),
) -> RowsPage:
    with sessions() as session:
        batch = owned_batch(session, batch_id.hex, caller)
        entries = reviews.review_queue(session, batch.id, limit=limit)
        rows = [RowView.of(e.item, e.job, e.correct, e.why) for e in entries]
        return RowsPage(data=rows, next_cursor=None)


@router.post(
    "/{batch_id}/cancel",
    response_model=CancelView,
    summary="Cancel what of the batch has not finished (what has is kept, counted and "
    "exported); running jobs stop at the end of their step. Again: nothing changes",
)
def cancel_batch(batch_id: uuid.UUID, caller: CallerDep, sessions: SessionsDep) -> CancelView:
    with sessions.begin() as session:
        batch = owned_batch(session, batch_id.hex, caller)
        done = cancel.cancel_batch(session, batch.id)
    return CancelView(
        id=batch.id, cancelled=done.cancelled, stopping=done.stopping, kept=done.finished
    )


@router.post(
    "/{batch_id}/resume",
    response_model=RequeuedView,
    summary="Take a cancelled batch up again: its cancelled jobs wait for their stage "
    "again; done work is not redone",
)
def resume_batch(
    batch_id: uuid.UUID,
    caller: CallerDep,
    sessions: SessionsDep,
    dispatcher: DispatcherDep,
    settings: SettingsDep,
) -> RequeuedView:
    found = _owned_id(batch_id, caller, sessions)
    requeued = cancel.resume_batch(sessions, dispatcher, found, quotas_of(caller, settings))
    return RequeuedView(id=found, requeued=len(requeued.job_ids), job_ids=requeued.job_ids)


@router.post(
    "/{batch_id}/retry",
    response_model=RequeuedView,
    summary="Run the batch's failed and cancelled jobs again, under the same batch "
    "(?error=CODE: only those that failed with that code)",
)
def retry_batch(
    batch_id: uuid.UUID,
    caller: CallerDep,
    sessions: SessionsDep,
    dispatcher: DispatcherDep,
    settings: SettingsDep,
    error: str | None = Query(None, max_length=64),
) -> RequeuedView:
    found = _owned_id(batch_id, caller, sessions)
    requeued = cancel.retry_batch(sessions, dispatcher, found, error, quotas_of(caller, settings))
    return RequeuedView(id=found, requeued=len(requeued.job_ids), job_ids=requeued.job_ids)


def _owned_id(batch_id: uuid.UUID, caller: Caller, sessions: sessionmaker[Session]) -> str:
    with sessions() as session:
        return owned_batch(session, batch_id.hex, caller).id
