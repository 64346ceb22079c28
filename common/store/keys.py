"""API keys: created once (the secret is shown then and never stored), checked by hash.

Each key belongs to a tenant (by default one named as the key): what it submits is the
tenant's, and it reads only the tenant's jobs and batches, unless it is an admin key,
which reads everyone's (and what the command line made, which has no tenant).
"""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from common.contracts import Priority
from common.store.ids import new_id
from common.store.tables import ApiKey, utcnow

PREFIX = "sk-speceyes-"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(
    session: Session,
    name: str,
    *,
    tenant: str | None = None,
    admin: bool = False,
    max_priority: Priority = Priority.HIGH,
    jobs_per_day: int | None = None,
    compute_s_per_day: float | None = None,
) -> tuple[ApiKey, str]:
    """A new key named ``name`` of ``tenant`` (default: ``name``), whose jobs may ask for
    ``max_priority`` at most, with its tenant's daily quotas if it sets them (else the
    deployment's); returns the row and the secret (shown once)."""
    secret = PREFIX + secrets.token_urlsafe(32)
    row = ApiKey(
        id=new_id(),
        name=name,
        key_hash=hash_key(secret),
        created_at=utcnow(),
        tenant=tenant or name,
        admin=admin,
        max_priority=max_priority.rank,
        jobs_per_day=jobs_per_day,
        compute_s_per_day=compute_s_per_day,
    )
    session.add(row)
    session.flush()
    return row, secret


def check_key(session: Session, key: str) -> ApiKey | None:
    """The live key row whose secret is ``key``, or None."""
    row = session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(key)))
    return row if row is not None and row.revoked_at is None else None


def list_keys(session: Session) -> list[ApiKey]:
    return list(session.scalars(select(ApiKey).order_by(ApiKey.created_at)))


def revoke_key(session: Session, name_or_id: str) -> int:
    rows = session.scalars(
        select(ApiKey).where(
            (ApiKey.name == name_or_id) | (ApiKey.id == name_or_id), ApiKey.revoked_at.is_(None)
        )
    ).all()
    for row in rows:
        row.revoked_at = utcnow()
    return len(rows)


def tenant_quotas(session: Session, tenant: str) -> tuple[int | None, float | None]:
    """The tenant's daily quotas its live keys set: the strictest of each (None: no key
    sets one), whichever of its keys submits."""
    query = select(func.min(ApiKey.jobs_per_day), func.min(ApiKey.compute_s_per_day)).where(
        ApiKey.tenant == tenant, ApiKey.revoked_at.is_(None)
    )
    jobs, compute = session.execute(query).one()
    return jobs, compute
