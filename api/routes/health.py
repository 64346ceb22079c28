"""Probes and metrics: ``/healthz`` (the process answers), ``/readyz`` (the store and the
dispatcher answer), ``/metrics`` (Prometheus). None of them needs a key."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from sqlalchemy import text

from api.deps import DispatcherDep, SessionsDep
from api.metrics import StoreAudit

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process answers")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="The database and the dispatcher (broker or runner) answer")
def readyz(sessions: SessionsDep, dispatcher: DispatcherDep) -> JSONResponse:
    checks: dict[str, str] = {}
    try:
        with sessions() as session:
            session.execute(text("select 1"))
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"unreachable: {type(exc).__name__}"
    if dispatcher.component is not None:
        try:
            dispatcher.check()
            checks[dispatcher.component] = "ok"
        except Exception as exc:
            checks[dispatcher.component] = f"unreachable: {exc}"
    ready = all(value == "ok" for value in checks.values())
    return JSONResponse({"ready": ready, **checks}, status_code=200 if ready else 503)


@router.get("/metrics", summary="Prometheus metrics of this process, and the store's audit")
def metrics(sessions: SessionsDep) -> PlainTextResponse:
    store = CollectorRegistry()
    store.register(StoreAudit(sessions))
    body = generate_latest() + generate_latest(store)
    return PlainTextResponse(body, media_type=CONTENT_TYPE_LATEST)
