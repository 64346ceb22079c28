"""The HTTP API: enqueue jobs, submit batches, poll by id, stream results.

Every /v1 route needs an API key (``Authorization: Bearer KEY`` or ``X-API-Key: KEY``;
``speceyes keys create NAME``). A job is written and committed first, then its id is
sent to the fast queue by task name (this package never imports the workers or torch);
with no broker, ``speceyes serve`` runs the embedded runner in-process instead.

Every error answer has one shape: ``{"error": "<code>", "detail": "<what to do>"}``.
A corrupt or non-image upload is refused with 422 before any job is created.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import Counter
from pydantic import ValidationError
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker
from starlette.exceptions import HTTPException

from api.intake import (
    ApiError,
    StoredImage,
    check_question,
    image_from_base64,
    image_from_bytes,
    image_from_path,
)
from api.schemas import BatchRequest, BatchSubmitted, BatchView, JobSpec, JobSubmitted, JobView
from common.config import Settings
from common.export import result_row
from common.store import jobs as store
from common.store.keys import check_key
from common.store.tables import QUEUED, Batch, BatchItem, Job

log = logging.getLogger(__name__)

SUBMITTED = Counter(
    "speceyes_api_jobs_submitted_total", "Jobs created through the API, by route.", ["route"]
)
REFUSED = Counter("speceyes_api_refused_total", "Requests answered 4xx, by error code.", ["error"])

Enqueue = Callable[[Sequence[str]], None]
JSONL_TYPES = ("application/x-ndjson", "application/jsonl", "application/json-lines")


def create_app(
    settings: Settings,
    *,
    sessions: sessionmaker[Session] | None = None,
    enqueue: Enqueue | None = None,
    embedded: bool = False,
) -> FastAPI:
    """The API over the store of ``settings``.

    Jobs go to ``enqueue`` if given, else to the broker if one is configured, else (with
    ``embedded``) to an embedded runner started with the app.
    """
    from common.store.db import open_store

    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state["sessions"] = sessions or open_store(settings.database_url)
        state["enqueue"], stop = _queueing(settings, state["sessions"], enqueue, embedded)
        yield
        stop()
        if sessions is None:
            state["sessions"].kw["bind"].dispose()

    app = FastAPI(
        title="SpecEyes",
        version="1",
        description="A speculative funnel in front of agentic vision-language models.",
        lifespan=lifespan,
    )
    _error_handlers(app)

    def db() -> sessionmaker[Session]:
        factory: sessionmaker[Session] = state["sessions"]
        return factory

    def require_key(request: Request) -> None:
        if not settings.api_require_keys:
            return
        header = request.headers.get("authorization", "")
        key = header.removeprefix("Bearer ").strip() or request.headers.get("x-api-key", "")
        if not key:
            raise ApiError(401, "unauthorized", "missing API key: Authorization: Bearer KEY")
        with db()() as session:
            if check_key(session, key) is None:
                raise ApiError(401, "unauthorized", "unknown or revoked API key")

    def limit_body(request: Request) -> None:
        length = int(request.headers.get("content-length") or 0)
        if length > settings.max_request_bytes:
            raise ApiError(
                413,
                "max_request_bytes",
                f"the request has {length} bytes; the limit (max_request_bytes) is "
                f"{settings.max_request_bytes}",
            )

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_key), Depends(limit_body)])

    @v1.post(
        "/jobs",
        status_code=202,
        response_model=JobSubmitted,
        openapi_extra={"requestBody": _job_body_doc()},
        summary="Submit one job (multipart upload, or JSON with base64 or a server path)",
    )
    async def submit_job(request: Request) -> JobSubmitted:
        spec, stored = await _read_job(request, settings)
        submitted = await run_in_threadpool(_create_job, db(), spec, stored)
        if submitted.created:
            state["enqueue"]([submitted.id])
            SUBMITTED.labels("jobs").inc()
        return submitted

    @v1.post(
        "/batches",
        status_code=202,
        response_model=BatchSubmitted,
        summary="Submit many jobs: JSON {name, jobs: [...]} or a JSONL body of jobs",
    )
    async def submit_batch(request: Request) -> BatchSubmitted:
        batch = await _read_batch(request, settings)
        if len(batch.jobs) > settings.max_batch_jobs:
            raise ApiError(
                413,
                "max_batch_jobs",
                f"{len(batch.jobs)} jobs; the limit (max_batch_jobs) is {settings.max_batch_jobs}",
            )
        key = request.headers.get("idempotency-key")
        stored = await run_in_threadpool(
            lambda: [_store_image(job, settings) for job in batch.jobs]
        )
        submitted, queued = await run_in_threadpool(_create_batch, db(), batch, stored, key)
        state["enqueue"](queued)
        SUBMITTED.labels("batches").inc(len(queued))
        return submitted

    @v1.get("/jobs/{job_id}", response_model=JobView, summary="A job: status, answer, timings")
    def get_job(job_id: uuid.UUID) -> JobView:
        with db()() as session:
            return JobView.of(_job_or_404(session, job_id))

    @v1.get("/jobs/{job_id}/trace", summary="A job's agent trajectory (null if none)")
    def get_trace(job_id: uuid.UUID) -> dict[str, Any]:
        with db()() as session:
            job = _job_or_404(session, job_id)
            return {"id": job.id, "status": job.status, "trajectory": job.trajectory}

    @v1.get("/batches/{batch_id}", response_model=BatchView, summary="Counts, beta, alpha")
    def get_batch(batch_id: uuid.UUID) -> BatchView:
        with db()() as session:
            batch = _batch_or_404(session, batch_id)
            return BatchView.of(batch, store.batch_counts(session, batch.id))

    @v1.get("/batches/{batch_id}/results", summary="A batch's results, streamed as JSONL")
    def get_results(batch_id: uuid.UUID) -> StreamingResponse:
        with db()() as session:
            batch_key = _batch_or_404(session, batch_id).id

        def rows() -> Iterator[bytes]:
            with db()() as session:
                for item, job in store.batch_results(session, batch_key):
                    yield (json.dumps(result_row(item, job), default=str) + "\n").encode()

        return StreamingResponse(rows(), media_type="application/x-ndjson")

    app.include_router(v1)

    @app.get("/healthz", summary="The process answers")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", summary="The database (and broker, if any) answer")
    def readyz() -> JSONResponse:
        checks: dict[str, str] = {}
        try:
            with db()() as session:
                session.execute(text("select 1"))
            checks["database"] = "ok"
        except Exception as exc:
            checks["database"] = f"unreachable: {type(exc).__name__}"
        if settings.broker_url:
            from common.broker import Broker

            broker = Broker(settings)
            try:
                broker.ping()
                checks["broker"] = "ok"
            except Exception as exc:
                checks["broker"] = f"unreachable: {exc}"
            finally:
                broker.close()
        ready = all(value == "ok" for value in checks.values())
        return JSONResponse({"ready": ready, **checks}, status_code=200 if ready else 503)

    @app.get("/metrics", summary="Prometheus metrics of this process")
    def metrics() -> PlainTextResponse:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return PlainTextResponse(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app


# -- queueing ---------------------------------------------------------------------------
def _queueing(
    settings: Settings, sessions: sessionmaker[Session], enqueue: Enqueue | None, embedded: bool
) -> tuple[Enqueue, Callable[[], None]]:
    """How submitted jobs reach a worker, and how to stop that at shutdown."""
    if enqueue is not None:
        return enqueue, lambda: None
    if settings.broker_url:
        from common.broker import Broker

        broker = Broker(settings)

        def send(ids: Sequence[str]) -> None:
            broker.send_fast(ids)

        return send, broker.close
    if embedded:
        from common.backends import load_models
        from common.runner import EmbeddedRunner

        runner = EmbeddedRunner(sessions, load_models(settings), settings)
        runner.serve()
        return (lambda ids: runner.notify()), runner.stop
    log.warning("no broker and no embedded runner: jobs will wait in the store")
    return (lambda ids: None), lambda: None


# -- reading requests --------------------------------------------------------------------
async def _read_job(request: Request, settings: Settings) -> tuple[JobSpec, StoredImage]:
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        form = await request.form(max_part_size=settings.max_upload_bytes + 1)
        upload = form.get("image")
        if upload is None or isinstance(upload, str):
            raise ApiError(422, "image_missing", "multipart field 'image' (a file) is required")
        data = await upload.read(settings.max_upload_bytes + 1)
        options = form.get("options")
        try:
            option_list = json.loads(str(options)) if options else None
        except json.JSONDecodeError:
            raise ApiError(422, "invalid_request", "options must be a JSON list") from None
        spec = _validated(
            JobSpec,
            {
                "question": form.get("question"),
                "options": option_list,
                "idempotency_key": form.get("idempotency_key"),
                "batch_id": form.get("batch_id"),
                "id": form.get("id"),
            },
        )
        check_question(spec.question, spec.options, settings)
        stored = await run_in_threadpool(image_from_bytes, data, settings)
        return spec, stored
    spec = _validated(JobSpec, await _json(request))
    return spec, await run_in_threadpool(_store_image, spec, settings)


async def _read_batch(request: Request, settings: Settings) -> BatchRequest:
    content_type = request.headers.get("content-type", "").split(";")[0].strip()
    if content_type in JSONL_TYPES:
        body = (await request.body()).decode("utf-8", errors="replace")
        jobs = []
        for number, line in enumerate(body.splitlines(), 1):
            if line.strip():
                try:
                    jobs.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ApiError(422, "invalid_jsonl", f"line {number}: {exc.msg}") from None
        return _validated(BatchRequest, {"name": request.query_params.get("name"), "jobs": jobs})
    return _validated(BatchRequest, await _json(request))


async def _json(request: Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(422, "invalid_json", f"the body is not JSON: {exc}") from None


def _validated(model: Any, data: Any) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ApiError(422, "invalid_request", _summary(exc.errors())) from None


def _store_image(spec: JobSpec, settings: Settings) -> StoredImage:
    check_question(spec.question, spec.options, settings)
    if spec.image_url is not None:
        raise ApiError(
            422, "url_fetching_disabled", "this server fetches no URLs; upload the image"
        )
    if (spec.image_base64 is None) == (spec.image_path is None):
        raise ApiError(422, "image_missing", "give exactly one of image_base64 or image_path")
    if spec.image_base64 is not None:
        return image_from_base64(spec.image_base64, settings)
    return image_from_path(spec.image_path or "", settings)


# -- writing jobs -----------------------------------------------------------------------
def _create_job(
    sessions: sessionmaker[Session], spec: JobSpec, stored: StoredImage
) -> JobSubmitted:
    """One job (or the one its idempotency key already names), committed."""
    key = (
        store.idempotency_key("client", spec.idempotency_key)
        if spec.idempotency_key
        else uuid.uuid4().hex
    )
    with sessions.begin() as session:
        existing = session.scalar(select(Job).where(Job.idempotency_key == key))
        if existing is not None:
            if (existing.image_hash, existing.question, existing.options) != (
                stored.digest, spec.question, spec.options,
            ):  # fmt: skip
                raise ApiError(
                    409,
                    "idempotency_conflict",
                    "this idempotency key names a job with another image or question",
                )
            return JobSubmitted(id=existing.id, status=existing.status, created=False)
        batch = _batch_or_404(session, _uuid(spec.batch_id, "batch_id")) if spec.batch_id else None
        item = store.NewItem(
            0, spec.id or "", spec.question, spec.options, stored.path, stored.digest,
            expected=spec.answer,
        )  # fmt: skip
        job_id = store.add_job(session, item, key)
        if batch is not None:
            session.flush()
            position = store.next_position(session, batch.id)
            session.add(
                BatchItem(
                    batch_id=batch.id,
                    position=position,
                    item_id=spec.id or job_id,
                    job_id=job_id,
                    expected=spec.answer,
                )
            )
        return JobSubmitted(id=job_id, status=QUEUED, created=True)


def _create_batch(
    sessions: sessionmaker[Session],
    request: BatchRequest,
    stored: list[StoredImage],
    key: str | None,
) -> tuple[BatchSubmitted, list[str]]:
    items = [
        store.NewItem(
            position,
            spec.id or str(position),
            spec.question,
            spec.options,
            image.path,
            image.digest,
            expected=spec.answer,
        )
        for position, (spec, image) in enumerate(zip(request.jobs, stored, strict=True))
    ]
    batch_key = store.idempotency_key("client-batch", key) if key else uuid.uuid4().hex
    with sessions.begin() as session:
        batch, created = store.get_or_create_batch(
            session, key=batch_key, name=request.name or "api", source="api", config={}
        )
        if created:
            store.submit_items(session, batch, items, config_key="api")
        rows = session.execute(
            select(BatchItem.job_id, Job.status)
            .join(Job, Job.id == BatchItem.job_id)
            .where(BatchItem.batch_id == batch.id)
            .order_by(BatchItem.position)
        ).all()
    job_ids = [job_id for job_id, _ in rows]
    queued = [job_id for job_id, status in rows if status == QUEUED] if created else []
    return BatchSubmitted(id=batch.id, job_ids=job_ids, created=created), queued


def _uuid(value: str, field: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ApiError(422, "invalid_request", f"{field}: not an id ({value!r})") from None


def _job_or_404(session: Session, job_id: uuid.UUID) -> Job:
    job = session.get(Job, job_id.hex)
    if job is None:
        raise ApiError(404, "job_not_found", f"no job {job_id.hex}")
    return job


def _batch_or_404(session: Session, batch_id: uuid.UUID) -> Batch:
    batch = session.get(Batch, batch_id.hex)
    if batch is None:
        raise ApiError(404, "batch_not_found", f"no batch {batch_id.hex}")
    return batch


# -- errors -----------------------------------------------------------------------------
def _error_handlers(app: FastAPI) -> None:
    def body(error: str, detail: str, status: int) -> JSONResponse:
        if 400 <= status < 500:
            REFUSED.labels(error).inc()
        return JSONResponse({"error": error, "detail": detail}, status_code=status)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return body(exc.error, exc.detail, exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return body("invalid_request", _summary(exc.errors()), 422)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        names = {404: "not_found", 405: "method_not_allowed"}
        return body(names.get(exc.status_code, "http_error"), str(exc.detail), exc.status_code)


def _summary(errors: Sequence[Any]) -> str:
    parts = []
    for error in errors[:5]:
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        parts.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
    return "; ".join(parts)


def _job_body_doc() -> dict[str, Any]:
    return {
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["image", "question"],
                    "properties": {
                        "image": {"type": "string", "format": "binary"},
                        "question": {"type": "string"},
                        "options": {"type": "string", "description": "JSON list of options"},
                        "idempotency_key": {"type": "string"},
                        "batch_id": {"type": "string"},
                        "id": {"type": "string"},
                    },
                }
            },
            "application/json": {"schema": JobSpec.model_json_schema()},
        }
    }
