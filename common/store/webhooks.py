"""Webhooks in the store: the tenants' endpoints, the outbox of events and their
deliveries. Sending them is ``common.pipeline.notify``'s.

An event is written in the transaction of the change it tells of, with one delivery per
URL that takes it, so a crash loses none (a transactional outbox) and an event with
nobody to take it costs nothing but a lookup. The events:

- ``job.finished``: a job sent alone (``POST /v1/jobs``) ended: done, failed or
  cancelled. Jobs of a batch are told of by their batch's end, never one by one.
- ``batch.finished``: every job of a batch ended. Noticed by the senders' sweep (a
  batch's end is no single write), which marks the batch announced in the transaction
  that writes the event; resuming or retrying the batch clears the mark.
- ``batch.cancelled``: a batch was cancelled, by its caller or by its failure budget.
- ``audit.alarm``: the online audit found a batch's accepted answers drifting.

Who takes an event: the tenant's endpoints that subscribe to its type (an endpoint takes
a batch's events only for batches made after it was registered), and the batch's or
job's own ``callback_url``. Both are signed (Standard Webhooks); a callback URL with the
tenant's callback secret (``callback_secret``).
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, exists, func, or_, select, update
from sqlalchemy.orm import Session

from common.contracts import FINISHED
from common.errors import InvalidInput
from common.store.ids import new_id
from common.store.tables import (
    Batch,
    BatchItem,
    Job,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
    WebhookSecret,
    iso_utc,
    utcnow,
)

JOB_FINISHED = "job.finished"
BATCH_FINISHED = "batch.finished"
BATCH_CANCELLED = "batch.cancelled"
AUDIT_ALARM = "audit.alarm"
EVENT_TYPES = (JOB_FINISHED, BATCH_FINISHED, BATCH_CANCELLED, AUDIT_ALARM)

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


def new_secret() -> str:
    """A signing secret as Standard Webhooks writes one: ``whsec_`` and 32 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def _owner(tenant: str | None) -> str:
    return tenant or ""  # (the command line's work has no tenant)


def _of_tenant(column: Any, tenant: str | None) -> Any:
    return column.is_(None) if tenant is None else column == tenant


# -- endpoints and secrets --------------------------------------------------------------
def add_endpoint(
    session: Session, tenant: str | None, url: str, events: Sequence[str], most: int = 20
) -> WebhookEndpoint:
    """A new endpoint of the tenant (``InvalidInput`` for a URL it has already, or past
    ``most`` endpoints: every event is written once per endpoint, in the transaction of
    its change)."""
    kept = endpoints(session, tenant)
    if any(endpoint.url == url for endpoint in kept):
        raise InvalidInput("an endpoint with this URL exists already", code="endpoint_exists")
    if len(kept) >= most:
        raise InvalidInput(
            f"{len(kept)} endpoints already, the most a tenant may have "
            "(webhook_max_endpoints): remove one first",
            code="max_endpoints",
        )
    endpoint = WebhookEndpoint(
        id=new_id(), tenant=tenant, url=url, events=list(events), secret=new_secret()
    )
    session.add(endpoint)
    session.flush()
    return endpoint


def endpoints(session: Session, tenant: str | None) -> list[WebhookEndpoint]:
    """The tenant's endpoints in use, oldest first."""
    query = select(WebhookEndpoint).where(
        _of_tenant(WebhookEndpoint.tenant, tenant), WebhookEndpoint.removed_at.is_(None)
    )
    return list(session.scalars(query.order_by(WebhookEndpoint.id)))


def remove_endpoint(session: Session, tenant: str | None, endpoint_id: str) -> bool:
    """Stop sending to an endpoint: it takes no more events, and what waits to go to it
    is failed (``endpoint removed``); what it was sent stays listed."""
    now = utcnow()
    statement = (
        update(WebhookEndpoint)
        .where(WebhookEndpoint.id == endpoint_id, _of_tenant(WebhookEndpoint.tenant, tenant))
        .where(WebhookEndpoint.removed_at.is_(None))
        .values(removed_at=now)
    )
    if not session.execute(statement).rowcount:  # type: ignore[attr-defined]
        return False
    session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.endpoint_id == endpoint_id, WebhookDelivery.state == PENDING)
        .values(state=FAILED, finished_at=now, last_error="endpoint removed")
    )
    return True


def callback_secret(session: Session, tenant: str | None) -> str:
    """The secret the tenant's callback URLs are signed with (made on first use)."""
    row = session.get(WebhookSecret, _owner(tenant))
    if row is None:
        row = WebhookSecret(owner=_owner(tenant), secret=new_secret())
        session.add(row)
        session.flush()
    return row.secret


# -- events ------------------------------------------------------------------------------
def emit(
    session: Session,
    type_: str,
    tenant: str | None,
    subject: str,
    data: dict[str, Any],
    *,
    callback_url: str | None = None,
    made_at: datetime | None = None,
) -> WebhookEvent | None:
    """Write an event and its deliveries (none, and no event, if nobody takes it).
    ``made_at``: when the batch it tells of was made (an endpoint registered after that
    does not take it)."""
    query = select(WebhookEndpoint).where(
        _of_tenant(WebhookEndpoint.tenant, tenant), WebhookEndpoint.removed_at.is_(None)
    )
    if made_at is not None:
        query = query.where(WebhookEndpoint.created_at <= made_at)
    urls: list[tuple[str | None, str]] = [
        (endpoint.id, endpoint.url)
        for endpoint in session.scalars(query.order_by(WebhookEndpoint.id))
        if type_ in endpoint.events
    ]
    if callback_url:
        callback_secret(session, tenant)  # (there to sign with when it is sent)
        urls.append((None, callback_url))
    if not urls:
        return None
    now = utcnow()
    event_id = new_id()
    body = {"type": type_, "timestamp": iso_utc(now), "data": data}
    event = WebhookEvent(
        id=event_id,
        tenant=tenant,
        type=type_,
        subject=subject,
        body=json.dumps(body, separators=(",", ":")),
        created_at=now,
    )
    session.add(event)
    session.flush()  # (the deliveries' key)
    for endpoint_id, url in urls:
        session.add(
            WebhookDelivery(
                id=new_id(),
                event_id=event_id,
                tenant=tenant,
                endpoint_id=endpoint_id,
                url=url,
                state=PENDING,
                attempts=0,
                next_at=now,
                created_at=now,
            )
        )
    session.flush()
    return event


def job_data(job: Job) -> dict[str, Any]:
    """What ``job.finished`` says of a job (``GET /v1/jobs/{id}`` says the rest)."""
    return {
        "id": job.id,
        "status": job.status,
        "answer": job.given_answer,
        "answered_by": job.answered_by,
        "error_code": job.error_code,
        "error_message": job.error_message,
        "finished_at": iso_utc(job.finished_at),
    }


def jobs_ended(session: Session, job_ids: Any) -> int:
    """Announce the ends of the jobs sent alone among ``job_ids`` (a list, or a subquery
    of ids) whose end is not yet told: called in the transaction that ended them. How
    many were announced."""
    if isinstance(job_ids, list | tuple) and not job_ids:
        return 0
    told = or_(Job.announced_at.is_(None), Job.announced_at < Job.finished_at)
    query = select(Job).where(
        Job.id.in_(job_ids), Job.announces.is_(True), Job.status.in_(FINISHED), told
    )
    announced = 0
    # (the rows as the statements before left them, not as this session first read them)
    fresh = query.order_by(Job.id).execution_options(populate_existing=True)
    for job in session.scalars(fresh).all():
        data = job_data(job)
        if emit(session, JOB_FINISHED, job.tenant, job.id, data, callback_url=job.callback_url):
            job.announced_at = job.finished_at  # (nobody listening: no write)
            announced += 1
    return announced


def batch_cancelled(session: Session, batch: Batch, reason: str) -> None:
    data = {"id": batch.id, "name": batch.name, "reason": reason, "stopped": batch.stopped}
    batch_event(session, BATCH_CANCELLED, batch, data)


def audit_alarm(session: Session, batch: Batch) -> None:
    batch_event(
        session,
        AUDIT_ALARM,
        batch,
        {"id": batch.id, "name": batch.name, "alarm": batch.audit_alarm},
    )


def batch_event(session: Session, type_: str, batch: Batch, data: dict[str, Any]) -> None:
    """An event of a batch: to the tenant's endpoints registered before it was made, and
    to its own callback URL."""
    emit(
        session,
        type_,
        batch.tenant,
        batch.id,
        data,
        callback_url=batch.callback_url,
        made_at=batch.created_at,
    )


def reopened(session: Session, batch_id: str) -> None:
    """A batch runs again (resumed, retried): its next end is announced anew."""
    session.execute(update(Batch).where(Batch.id == batch_id).values(announced_at=None))


def batches_ended(session: Session, limit: int = 100) -> list[str]:
    """Announce the batches that someone listens to whose every job has ended since they
    were made (or last reopened); the ids announced. Batches nobody listens to are never
    read here."""
    subscribed = exists().where(
        or_(
            and_(WebhookEndpoint.tenant.is_(None), Batch.tenant.is_(None)),
            WebhookEndpoint.tenant == Batch.tenant,
        ),
        WebhookEndpoint.removed_at.is_(None),
        WebhookEndpoint.created_at <= Batch.created_at,
    )
    unfinished = (
        select(BatchItem.job_id)
        .join(Job, Job.id == BatchItem.job_id)
        .where(BatchItem.batch_id == Batch.id, Job.status.not_in(FINISHED))
        .exists()
    )
    query = (
        select(Batch)
        .where(Batch.announced_at.is_(None), or_(Batch.callback_url.is_not(None), subscribed))
        .where(~unfinished)
        .order_by(Batch.id)
        .limit(limit)
    )
    announced = []
    locked = query.with_for_update(skip_locked=True).execution_options(populate_existing=True)
    for batch in session.scalars(locked).all():
        counts = dict(
            session.execute(
                select(Job.status, func.count())
                .join(BatchItem, BatchItem.job_id == Job.id)
                .where(BatchItem.batch_id == batch.id)
                .group_by(Job.status)
            ).all()
        )
        data = {"id": batch.id, "name": batch.name, "counts": counts, "stopped": batch.stopped}
        batch_event(session, BATCH_FINISHED, batch, data)
        batch.announced_at = utcnow()
        announced.append(batch.id)
    return announced


# -- deliveries --------------------------------------------------------------------------
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
    """The tenant's deliveries, newest first, each with its event and its tries."""
    query = select(WebhookDelivery, WebhookEvent).join(
        WebhookEvent, WebhookEvent.id == WebhookDelivery.event_id
    )
    if not everyone:
        query = query.where(_of_tenant(WebhookDelivery.tenant, tenant))
    if state is not None:
        query = query.where(WebhookDelivery.state == state)
    if after is not None:
        query = query.where(WebhookDelivery.id < after)
    rows = session.execute(query.order_by(WebhookDelivery.id.desc()).limit(limit + 1)).all()
    page, more = rows[:limit], len(rows) > limit
    ids = [delivery.id for delivery, _ in page]
    attempts: dict[str, list[WebhookAttempt]] = {i: [] for i in ids}
    if ids:
        query_attempts = select(WebhookAttempt).where(WebhookAttempt.delivery_id.in_(ids))
        for attempt in session.scalars(query_attempts.order_by(WebhookAttempt.id)):
            attempts[attempt.delivery_id].append(attempt)
    cursor = page[-1][0].id if more and page else None
    return [(d, e, attempts[d.id]) for d, e in page], cursor
