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
tenant's callback secret (``callback_secret``). Taking deliveries to send and keeping
their tries: ``common.store.deliveries``.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, exists, or_, select, update
from sqlalchemy.orm import Session

from common.contracts import FINISHED, UNFINISHED
from common.errors import InvalidInput
from common.store import listing, tallies
from common.store.ids import new_id
from common.store.tables import (
    Batch,
    Job,
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


def of_tenant(column: Any, tenant: str | None) -> Any:
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
        of_tenant(WebhookEndpoint.tenant, tenant), WebhookEndpoint.removed_at.is_(None)
    )
    return list(session.scalars(query.order_by(WebhookEndpoint.id)))


def remove_endpoint(session: Session, tenant: str | None, endpoint_id: str) -> bool:
    """Stop sending to an endpoint: it takes no more events, and what waits to go to it
    is failed (``endpoint removed``); what it was sent stays listed."""
    now = utcnow()
    statement = (
        update(WebhookEndpoint)
        .where(WebhookEndpoint.id == endpoint_id, of_tenant(WebhookEndpoint.tenant, tenant))
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
        of_tenant(WebhookEndpoint.tenant, tenant), WebhookEndpoint.removed_at.is_(None)
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
    unfinished = tallies.jobs_in(Batch.id, UNFINISHED) > 0
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
        counts = dict(listing.counted(session, [batch])[0].by_status)
        data = {"id": batch.id, "name": batch.name, "counts": counts, "stopped": batch.stopped}
        batch_event(session, BATCH_FINISHED, batch, data)
        batch.announced_at = utcnow()
        announced.append(batch.id)
    return announced
