"""``/v1/batches``: submit many jobs at once, follow the batch, stream its results."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session

from api.deps import Caller, CallerDep, DispatcherDep, SessionsDep, SettingsDep
from api.intake import (
    check_in_flight,
    new_item,
    public_path,
    read_batch,
    store_image,
    unsent,
)
from api.metrics import SUBMITTED
from api.schemas import BatchSubmitted, BatchView
from common.audit import figures
from common.dispatch import send_waiting
from common.errors import NotFound
from common.export import result_row
from common.store import reads, submission
from common.store.tables import Batch

router = APIRouter(prefix="/batches", tags=["batches"])


@router.post(
    "",
    status_code=202,
    response_model=BatchSubmitted,
    summary="Submit many jobs: JSON {name, jobs: [...]} or a JSONL body of jobs",
)
async def submit_batch(
    request: Request,
    caller: CallerDep,
    settings: SettingsDep,
    sessions: SessionsDep,
    dispatcher: DispatcherDep,
) -> BatchSubmitted:
    batch = await read_batch(request, settings)
    stored = await run_in_threadpool(lambda: [store_image(job, settings) for job in batch.jobs])
    items = [
        new_item(spec, image, position, spec.id or str(position))
        for position, (spec, image) in enumerate(zip(batch.jobs, stored, strict=True))
    ]
    client_key = request.headers.get("idempotency-key")

    def create() -> submission.SubmittedBatch:
        with dispatcher.transaction(sessions, on_send_error=unsent) as outbox:
            submitted = submission.submit_batch(
                outbox.session,
                items,
                name=batch.name or "api",
                client_key=client_key,
                tenant=caller.tenant,
            )
            if submitted.created:
                check_in_flight(outbox.session, caller, settings, adding=len(submitted.queued))
                outbox.to_fast(submitted.queued)
            else:  # a retry: send what still waits again (a duplicate changes nothing)
                send_waiting(outbox, submitted.id)
        return submitted

    submitted = await run_in_threadpool(submission.resolving_races, create)
    SUBMITTED.labels("batches").inc(len(submitted.queued))
    return BatchSubmitted(id=submitted.id, job_ids=submitted.job_ids, created=submitted.created)


@router.get("/{batch_id}", response_model=BatchView, summary="Counts, beta, alpha")
def get_batch(
    batch_id: uuid.UUID, caller: CallerDep, settings: SettingsDep, sessions: SessionsDep
) -> BatchView:
    with sessions() as session:
        batch = _batch_or_404(session, batch_id, caller)
        audit = {**figures(session, settings, batch.id).as_dict(), "alarm": batch.audit_alarm}
        return BatchView.of(batch, reads.batch_counts(session, batch.id), audit)


@router.get("/{batch_id}/results", summary="A batch's results, streamed as JSONL")
def get_results(
    batch_id: uuid.UUID, caller: CallerDep, settings: SettingsDep, sessions: SessionsDep
) -> StreamingResponse:
    with sessions() as session:
        found = _batch_or_404(session, batch_id, caller).id

    uploads = settings.api.upload_dir.resolve()

    def rows() -> Iterator[bytes]:
        with sessions() as session:
            for item, job in reads.batch_results(session, found):
                row = {**result_row(item, job), "image": public_path(job.image_path, uploads)}
                yield (json.dumps(row, default=str) + "\n").encode()

    return StreamingResponse(rows(), media_type="application/x-ndjson")


def _batch_or_404(session: Session, batch_id: uuid.UUID, caller: Caller) -> Batch:
    batch = reads.get_batch(session, batch_id.hex)
    if batch is None or not caller.may_read(batch.tenant):
        raise NotFound(f"no batch {batch_id.hex}", code="batch_not_found")
    return batch
