"""``GET /v1/usage``: what a tenant's jobs used, by day and stage (``common.store.usage``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from api.deps import CallerDep, SessionsDep, SettingsDep
from api.errors import ApiError
from common.store import usage
from common.store.tables import as_utc

router = APIRouter(prefix="/usage", tags=["usage"])

DEFAULT_DAYS = 7  # the window without ``from``
MAX_DAYS = 366  # the longest window one request reads


class DayUsageView(BaseModel):
    day: str = Field(description="YYYY-MM-DD, UTC: the day the jobs finished")
    tenant: str | None = Field(description="whose (null: the command line's)")
    jobs: int
    seconds: dict[str, float] = Field(
        description="model seconds per phase: screen, speculate, gate, agent, sandbox"
    )
    total_s: float
    tokens_in: int
    tokens_out: int
    cost: float | None = Field(None, description="with a price per GPU-hour set")


class UsageWindowView(BaseModel):
    start: datetime = Field(alias="from")
    end: datetime = Field(alias="to")
    data: list[DayUsageView]


@router.get(
    "",
    response_model=UsageWindowView,
    response_model_by_alias=True,
    summary="Jobs, model seconds and tokens by day and stage",
)
def get_usage(
    caller: CallerDep,
    sessions: SessionsDep,
    settings: SettingsDep,
    start: Annotated[
        datetime | None, Query(alias="from", description="from (ISO 8601; default 7 days ago)")
    ] = None,
    end: Annotated[datetime | None, Query(alias="to", description="before (default now)")] = None,
    tenant: Annotated[
        str | None,
        Query(
            description="an admin key's choice of tenant (default: every one; empty: the "
            "command line's); any other key may name only its own"
        ),
    ] = None,
) -> dict[str, Any]:
    """The caller's tenant's jobs that finished in the window, by day (UTC) and tenant;
    an admin key reads every tenant's, or the one it names."""
    end = as_utc(end) if end is not None else datetime.now(UTC)
    start = as_utc(start) if start is not None else end - timedelta(days=DEFAULT_DAYS)
    if start >= end:
        raise ApiError(422, "invalid_request", "from must be before to")
    if end - start > timedelta(days=MAX_DAYS):
        raise ApiError(422, "invalid_request", f"a window of at most {MAX_DAYS} days")
    if tenant is not None and not caller.admin:
        raise ApiError(403, "tenant_not_allowed", "only an admin key names a tenant")
    whose: str | object | None = caller.tenant
    if caller.admin:
        whose = usage.EVERY_TENANT if tenant is None else tenant
    with sessions() as session:
        days = usage.by_day(session, whose, start, end)
    price = settings.accounting.price_per_gpu_hour
    return {"from": start, "to": end, "data": [day.to_dict(price) for day in days]}
