"""``/openai/v1/files``: a caller's JSONL of batch requests (``purpose=batch``) or an
image its requests name by id (``purpose=vision``), uploaded, described and read back;
and the output and error files of its batches, made from the store when read
(``api.openai.output``).

An upload is bounded before it is kept: a JSONL at most ``api.max_file_bytes`` bytes and
``max_batch_jobs`` lines, UTF-8; an image is checked as an upload to ``POST /v1/jobs``
is. Each line is read when a batch is made from the file: a line that is wrong fails
alone there, in the error file.
"""

from __future__ import annotations

import os
import re

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, Response
from pydantic import BaseModel
from sqlalchemy.orm import Session, sessionmaker

from api.deps import Caller, CallerDep, SessionsDep, SettingsDep
from api.errors import ApiError
from api.intake import StoredImage, image_from_bytes
from api.openai import output
from api.openai.requests import FILE_ID
from common.config import Settings
from common.images import content_hash, keep_bytes
from common.limits import printable
from common.store import openai_batches
from common.store.openai_tables import OpenAIFile

router = APIRouter(prefix="/files", tags=["openai"])


class FileObject(BaseModel):
    id: str
    object: str = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str = "processed"
    expires_at: int | None = None
    status_details: str | None = None


def owned_file(session: Session, file_id: str, caller: Caller) -> OpenAIFile:
    """An uploaded file, if the caller may read it; another tenant's is as absent as one
    that never was."""
    row = session.get(OpenAIFile, file_id) if FILE_ID.fullmatch(file_id) else None
    if row is None or not caller.may_read(row.tenant):
        raise ApiError(404, "file_not_found", f"no file {file_id[:60]}")
    return row


@router.post(
    "",
    response_model=FileObject,
    summary="Upload a JSONL of batch requests (purpose=batch) or an image (purpose=vision)",
)
async def upload_file(
    request: Request, caller: CallerDep, settings: SettingsDep, sessions: SessionsDep
) -> FileObject:
    limit = max(settings.api.max_file_bytes, settings.api.max_upload_bytes)
    form = await request.form(max_part_size=limit + 1)
    purpose, upload = form.get("purpose"), form.get("file")
    if purpose not in ("batch", "vision"):
        raise ApiError(
            400,
            "purpose_unsupported",
            f"purpose {str(purpose)[:40]!r}: 'batch' (a JSONL of requests) or 'vision' (an "
            "image a request names by its file id)",
        )
    if upload is None or isinstance(upload, str):
        raise ApiError(400, "file_missing", "multipart field 'file' is required")
    data = await upload.read(limit + 1)
    filename = printable(upload.filename or f"{purpose}.bin", 200)

    def keep() -> FileObject:
        if purpose == "vision":  # (checked as an upload of POST /v1/jobs is)
            path, lines = image_from_bytes(data, settings).path, 0
        else:
            lines = _checked(data, settings)
            path, _ = keep_bytes(data, settings.api.upload_dir / "openai-files", ".jsonl")
        with sessions.begin() as session:
            row = openai_batches.add_file(
                session, caller.tenant, filename, len(data), lines, path, str(purpose)
            )
            return _described(row)

    return await run_in_threadpool(keep)


def stored_image(sessions: sessionmaker[Session], caller: Caller, file_id: str) -> StoredImage:
    """An image the caller uploaded (``purpose=vision``), as a job's image."""
    with sessions() as session:
        row = owned_file(session, file_id, caller)
        path, purpose = row.path, row.purpose
    if purpose != "vision":
        raise ApiError(400, "file_not_an_image", f"{file_id} is a {purpose} file, not an image")
    try:
        with open(path, "rb") as kept:
            return StoredImage(path, content_hash(kept.read()))
    except OSError:
        raise ApiError(404, "file_unavailable", f"file {file_id} cannot be read now") from None


def request_lines(text: str) -> list[tuple[int, str]]:
    """The file's lines that are not blank, each with its number (blank lines counted).
    Lines end at a newline only: JSON may hold U+2028 in a string."""
    numbered = enumerate(re.split(r"\r?\n", text), 1)
    return [(number, line) for number, line in numbered if line.strip()]


def _checked(data: bytes, settings: Settings) -> int:
    """The file's count of lines, once it is within the limits."""
    if len(data) > settings.api.max_file_bytes:
        raise ApiError(
            413,
            "max_file_bytes",
            f"the file is over the limit (api.max_file_bytes) of "
            f"{settings.api.max_file_bytes} bytes",
        )
    try:
        text = data.decode("utf-8-sig")  # (a byte-order mark is no request)
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_file", "the file is not UTF-8 text (JSONL)") from None
    lines = len(request_lines(text))
    if not lines:
        raise ApiError(400, "empty_file", "the file holds no request")
    if lines > settings.api.max_batch_jobs:
        raise ApiError(
            413,
            "max_batch_jobs",
            f"{lines} requests; the limit (api.max_batch_jobs) is {settings.api.max_batch_jobs}",
        )
    return lines


@router.get("/{file_id}", response_model=FileObject, summary="A file: its size and purpose")
def get_file(file_id: str, caller: CallerDep, sessions: SessionsDep) -> FileObject:
    with sessions.begin() as session:
        made = output.made_file(session, file_id, caller)
        if made is not None:
            return FileObject(
                id=file_id,
                bytes=len(made.content),
                created_at=made.created_at,
                filename=made.filename,
                purpose="batch_output",
            )
        return _described(owned_file(session, file_id, caller))


@router.get("/{file_id}/content", summary="A file's bytes (an output or error file: JSONL)")
def file_content(file_id: str, caller: CallerDep, sessions: SessionsDep) -> Response:
    with sessions.begin() as session:
        made = output.made_file(session, file_id, caller)
        if made is not None:
            return Response(made.content, media_type="application/jsonl")
        path = owned_file(session, file_id, caller).path
    if not os.path.isfile(path):
        raise ApiError(404, "file_unavailable", f"file {file_id} cannot be read now")
    return FileResponse(path, media_type="application/jsonl")  # (streamed from disk)


def _described(row: OpenAIFile) -> FileObject:
    return FileObject(
        id=row.id,
        bytes=row.bytes,
        created_at=int(row.created_at.timestamp()),
        filename=row.filename,
        purpose=row.purpose,
    )
