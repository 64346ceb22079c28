"""An OpenAI batch's output and error files, made from the store when read.

The output file holds a line per request that was answered: ``{"id", "custom_id",
"response": {"status_code": 200, "request_id", "body": <chat.completion>}, "error":
null}``. The error file holds the rest, each with why: a request that failed has a
``response`` with OpenAI's error body (400 where it was refused before it ran: its line
unreadable, its image broken; 500 where its run failed: the agent found no answer); one
that never ran (the batch was cancelled or expired first) has ``error`` with
``batch_cancelled`` or ``batch_expired``. ``custom_id`` maps one to one to the input's
lines (an unreadable line, which has none, is named by its line number).

A file's id names its batch and its kind: ``file-<batch id>-output``, ``-errors``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from api.browse import owned_batch
from api.deps import Caller
from api.openai.shapes import completion_of
from common.contracts import CancelReason, JobStatus
from common.errors import NotFound
from common.store import reads
from common.store.openai_tables import OpenAIBatch
from common.store.tables import BatchItem, Job

KINDS = ("output", "errors")
_MADE_ID = re.compile(r"file-([0-9a-f]{32})-(output|errors)")


@dataclass(frozen=True)
class MadeFile:
    content: bytes
    created_at: int
    filename: str


def file_ids(batch_id: str) -> dict[str, str]:
    return {kind: f"file-{batch_id}-{kind}" for kind in KINDS}


def made_file(session: Session, file_id: str, caller: Caller) -> MadeFile | None:
    """The output or error file ``file_id`` names, made now; None if it names neither
    (an uploaded file). Another tenant's batch is a 404 (as one that never was)."""
    found = _MADE_ID.fullmatch(file_id)
    if found is None:
        return None
    head, kind = found[1], found[2]
    try:
        batch = owned_batch(session, head, caller)
    except NotFound:
        return None
    row = session.get(OpenAIBatch, batch.id)
    if row is None:
        return None
    lines = [
        json.dumps(line, default=str)
        for item, job in reads.batch_results(session, batch.id)
        if (line := _line(item, job, row.model, kind)) is not None
    ]
    content = "".join(f"{line}\n" for line in lines).encode()
    return MadeFile(content, int(batch.created_at.timestamp()), f"{batch.id}_{kind}.jsonl")


def _line(item: BatchItem, job: Job, model: str, kind: str) -> dict[str, Any] | None:
    # (a line with no usable custom_id has "": null here; its message names the line)
    base = {"id": f"batch_req_{job.id}_{item.position}", "custom_id": item.item_id or None}
    if job.status == JobStatus.DONE:
        if kind != "output":
            return None
        body = completion_of(job, model).model_dump()
        response = {"status_code": 200, "request_id": job.id, "body": body}
        return {**base, "response": response, "error": None}
    if kind != "errors" or job.status not in (JobStatus.FAILED, JobStatus.CANCELLED):
        return None
    if job.status == JobStatus.CANCELLED:
        code = "batch_expired" if job.error_code == CancelReason.EXPIRED else "batch_cancelled"
        return {**base, "response": None, "error": {"code": code, "message": job.error_message}}
    # refused at intake (it never ran): the request was wrong; else its run failed
    refused = job.fast_started_at is None and job.agent_started_at is None
    error = {
        "message": job.error_message,
        "type": "invalid_request_error" if refused else "server_error",
        "param": None,
        "code": job.error_code,
    }
    status = 400 if refused else 500
    response = {"status_code": status, "request_id": job.id, "body": {"error": error}}
    return {**base, "response": response, "error": None}
