"""Webhook deliveries on their way: taken by a sender when due (held past one try's
time limit, so a sender that dies leaves them to another), each try kept, and listed for
their tenant with their tries. The events and who takes them: ``common.store.webhooks``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from common.store.ids import new_id
from common.store.listing import Window
from common.store.tables import (
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
    utcnow,
)
from common.store.webhooks import DELIVERED, FAILED, PENDING, callback_secret


@dataclass(frozen=True)
class Due:
    """A delivery a sender holds: where to, what, signed with which secret."""

    id: str
    event_id: str
    url: str
    body: str
    secret: str
    attempt: int  # this try's number, from 1
    expires_at: datetime  # past this, it is given up (retry_for_s after the event)


def claim_due(session: Session, limit: int, hold_s: float, retry_for_s: float) -> list[Due]:
    """Take up to ``limit`` deliveries that are due, each held ``hold_s`` (past one try's
    time limit: a sender that dies leaves it to be tried again then)."""
    now = utcnow()
    query = (
        select(WebhookDelivery, WebhookEvent.body, WebhookEvent.created_at)
        .join(WebhookEvent, WebhookEvent.id == WebhookDelivery.event_id)
        .where(WebhookDelivery.state == PENDING, WebhookDelivery.next_at <= now)
        .order_by(WebhookDelivery.next_at)
        .limit(limit)
        .with_for_update(of=WebhookDelivery, skip_locked=True)
    )
    due = []
    for delivery, body, made in session.execute(query).all():
        expires_at = made + timedelta(seconds=retry_for_s)
        if now >= expires_at:  # (its time ran out while it waited, or while held)
            delivery.state, delivery.finished_at = FAILED, now
            delivery.last_error = (delivery.last_error or "no try ended") + "; given up"
            continue
        delivery.attempts += 1
        delivery.next_at = now + timedelta(seconds=hold_s)
        due.append(
            Due(
                id=delivery.id,
                event_id=delivery.event_id,
                url=delivery.url,
                body=body,
                secret=_secret_of(session, delivery),
                attempt=delivery.attempts,
                expires_at=expires_at,
            )
        )
    session.flush()
    return due


def _secret_of(session: Session, delivery: WebhookDelivery) -> str:
    if delivery.endpoint_id is not None:
        endpoint = session.get(WebhookEndpoint, delivery.endpoint_id)
        if endpoint is not None:
            return endpoint.secret
    return callback_secret(session, delivery.tenant)


def record_attempt(
    session: Session,
    due: Due,
    *,
    at: datetime,
    seconds: float,
    status_code: int | None,
    error: str | None,
    retry_in_s: float | None,
) -> str:
    """Keep a try and move its delivery on: delivered (an answer in 2xx), tried again in
    ``retry_in_s``, or failed once its time ran out. The delivery's state after."""
    session.add(
        WebhookAttempt(
            id=new_id(),
            delivery_id=due.id,
            at=at,
            status_code=status_code,
            error=error,
            seconds=round(seconds, 3),
        )
    )
    delivery = session.get(WebhookDelivery, due.id, with_for_update=True)
    if delivery is None or delivery.state != PENDING:  # (ended by another sender meanwhile)
        return delivery.state if delivery is not None else FAILED
    now = utcnow()
    delivery.last_error = error
    if error is None:
        delivery.state, delivery.finished_at = DELIVERED, now
    elif retry_in_s is None or now + timedelta(seconds=retry_in_s) > due.expires_at:
        delivery.state, delivery.finished_at = FAILED, now
    else:
        delivery.next_at = now + timedelta(seconds=retry_in_s)
    session.flush()
    return delivery.state


def deliveries_page(
    session: Session,
    tenant: str | None,
    *,
    everyone: bool = False,
    state: str | None = None,
    after: str | None = None,
    limit: int = 50,
) -> tuple[list[tuple[WebhookDelivery, WebhookEvent, list[WebhookAttempt]]], str | None]:
    """The tenant's deliveries, newest first, each with its event and its tries: cut by
    id a page at a time, as every listing is (``common.store.listing.Window``)."""
    window = Window(tenant, everyone=everyone, after=after, limit=limit)
    query: Any = select(WebhookDelivery, WebhookEvent).join(
        WebhookEvent, WebhookEvent.id == WebhookDelivery.event_id
    )
    if state is not None:
        query = query.where(WebhookDelivery.state == state)
    rows = list(session.execute(window.cut(query, WebhookDelivery)).all())
    page, cursor = window.page(rows, lambda row: row[0].id)
    ids = [delivery.id for delivery, _ in page]
    attempts: dict[str, list[WebhookAttempt]] = {i: [] for i in ids}
    if ids:
        query_attempts = select(WebhookAttempt).where(WebhookAttempt.delivery_id.in_(ids))
        for attempt in session.scalars(query_attempts.order_by(WebhookAttempt.id)):
            attempts[attempt.delivery_id].append(attempt)
    return [(d, e, attempts[d.id]) for d, e in page], cursor
