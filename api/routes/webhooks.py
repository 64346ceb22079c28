"""``/v1/webhooks``: your endpoints (register, list, remove), the secret your callback
URLs are signed with, and every delivery with each of its tries
(``common.pipeline.notify`` sends them; ``docs/api.md`` has a receiver)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response

from api.browse import After, Limit
from api.deps import CallerDep, SessionsDep, SettingsDep
from api.errors import ApiError
from api.intake import checked_callback, parse_id
from api.webhook_schemas import (
    DeliveriesPage,
    DeliveryView,
    EndpointsPage,
    EndpointSpec,
    EndpointView,
    SecretView,
)
from common.store import deliveries, webhooks

router = APIRouter(prefix="/webhooks", tags=["webhooks"])


@router.post(
    "",
    status_code=201,
    response_model=EndpointView,
    summary="Register an endpoint for your events; its signing secret comes back",
)
def add_endpoint(
    spec: EndpointSpec, caller: CallerDep, settings: SettingsDep, sessions: SessionsDep
) -> EndpointView:
    url = checked_callback(spec.url, settings)
    events = spec.events if spec.events is not None else list(webhooks.EVENT_TYPES)
    unknown = sorted(set(events) - set(webhooks.EVENT_TYPES))
    if unknown or not events:
        raise ApiError(
            422,
            "invalid_request",
            f"events are some of {', '.join(webhooks.EVENT_TYPES)}; not {unknown or 'none'}",
        )
    with sessions.begin() as session:
        most = settings.webhooks.max_endpoints
        endpoint = webhooks.add_endpoint(session, caller.tenant, url, events, most)
        return EndpointView.of(endpoint)


@router.get("", response_model=EndpointsPage, summary="Your endpoints, oldest first")
def list_endpoints(caller: CallerDep, sessions: SessionsDep) -> EndpointsPage:
    with sessions() as session:
        found = webhooks.endpoints(session, caller.tenant)
        return EndpointsPage(data=[EndpointView.of(endpoint) for endpoint in found])


@router.delete(
    "/{endpoint_id}",
    status_code=204,
    summary="Stop sending to an endpoint (deliveries on their way end as they are)",
)
def remove_endpoint(endpoint_id: str, caller: CallerDep, sessions: SessionsDep) -> Response:
    with sessions.begin() as session:
        if not webhooks.remove_endpoint(session, caller.tenant, parse_id(endpoint_id, "id")):
            raise ApiError(404, "endpoint_not_found", f"you have no endpoint {endpoint_id}")
    return Response(status_code=204)


@router.get(
    "/secret",
    response_model=SecretView,
    summary="The secret deliveries to your callback URLs are signed with",
)
def callback_secret(caller: CallerDep, sessions: SessionsDep) -> SecretView:
    with sessions.begin() as session:
        return SecretView(secret=webhooks.callback_secret(session, caller.tenant))


State = Literal["pending", "delivered", "failed"]


@router.get(
    "/deliveries",
    response_model=DeliveriesPage,
    summary="Your deliveries, newest first, each with its tries (filter: state)",
)
def list_deliveries(
    caller: CallerDep,
    sessions: SessionsDep,
    after: After = None,
    limit: Limit = 50,
    state: Annotated[State | None, Query(description="only deliveries in this state")] = None,
) -> DeliveriesPage:
    cursor = None if after is None else parse_id(after, "after")
    with sessions() as session:
        rows, next_cursor = deliveries.deliveries_page(
            session,
            caller.tenant,
            everyone=caller.admin,
            state=state,
            after=cursor,
            limit=limit,
        )
        return DeliveriesPage(data=[DeliveryView.of(*row) for row in rows], next_cursor=next_cursor)
