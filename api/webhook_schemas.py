"""Request and response bodies of the webhook routes (``api.routes.webhooks``): the
endpoints a tenant registers, its signing secret, and the deliveries of its events."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from api.schemas import Page
from common.store.tables import WebhookAttempt, WebhookDelivery, WebhookEndpoint, WebhookEvent


class EndpointSpec(BaseModel):
    """A URL to post your events to."""

    url: str = Field(description="http(s); a public address (an operator may allow others)")
    events: list[str] | None = Field(
        None,
        description="which of job.finished, batch.finished, batch.cancelled, audit.alarm; "
        "default: all",
    )


class EndpointView(BaseModel):
    id: str
    url: str
    events: list[str]
    created_at: datetime
    secret: str | None = Field(
        None,
        description="verify deliveries with it (Standard Webhooks); shown when the endpoint "
        "is made, and in the listing",
    )

    @classmethod
    def of(cls, endpoint: WebhookEndpoint) -> EndpointView:
        return cls(
            id=endpoint.id,
            url=endpoint.url,
            events=endpoint.events,
            created_at=endpoint.created_at,
            secret=endpoint.secret,
        )


class EndpointsPage(BaseModel):
    data: list[EndpointView]


class SecretView(BaseModel):
    secret: str = Field(description="what your callback URLs' deliveries are signed with")


class AttemptView(BaseModel):
    at: datetime
    status_code: int | None = Field(description="the receiver's answer; null: none came")
    error: str | None = Field(description="why it did not deliver; null: it did")
    seconds: float


class DeliveryView(BaseModel):
    id: str
    event_id: str = Field(description="the webhook-id header: the same on every try")
    event_type: str
    subject: str = Field(description="the job's or the batch's id")
    url: str
    endpoint_id: str | None = Field(description="null: a batch's or job's callback_url")
    state: str = Field(description="pending (tried again at next_at), delivered or failed")
    next_at: datetime | None
    created_at: datetime
    finished_at: datetime | None
    attempts: list[AttemptView]

    @classmethod
    def of(
        cls, delivery: WebhookDelivery, event: WebhookEvent, attempts: list[WebhookAttempt]
    ) -> DeliveryView:
        return cls(
            id=delivery.id,
            event_id=event.id,
            event_type=event.type,
            subject=event.subject,
            url=delivery.url,
            endpoint_id=delivery.endpoint_id,
            state=delivery.state,
            next_at=delivery.next_at if delivery.state == "pending" else None,
            created_at=delivery.created_at,
            finished_at=delivery.finished_at,
            attempts=[
                AttemptView(at=a.at, status_code=a.status_code, error=a.error, seconds=a.seconds)
                for a in attempts
            ],
        )


class DeliveriesPage(Page[DeliveryView]):
    """Webhook deliveries, newest first."""
