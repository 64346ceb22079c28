"""Daily quotas per tenant: jobs submitted, and model seconds used (``GET /v1/usage``'s
figures), a UTC day at a time. A key may set its tenant's own (``ApiKey.jobs_per_day``,
``compute_s_per_day``), else the deployment's apply (``accounting.max_jobs_per_day``,
``accounting.max_compute_s_per_day``).

Checked inside the transaction that creates a submission's jobs, after they were added:
a submission past a quota is refused whole (429, ``Retry-After`` the next day, the
quota and the figures in its detail) and nothing of it is kept; work already running
finishes. What the command line submits has no tenant, and no quota.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from api.deps import Caller, too_many
from api.metrics import QUOTA_REFUSED
from common.config import Settings
from common.store import usage
from common.store.tables import utcnow


def check_quotas(session: Session, caller: Caller, settings: Settings, adding: int) -> None:
    """Refuse (429) ``adding`` new jobs of the caller's tenant past one of its quotas."""
    tenant = caller.tenant
    if tenant is None or not adding:
        return
    defaults = settings.accounting
    jobs = caller.jobs_per_day if caller.jobs_per_day is not None else defaults.max_jobs_per_day
    compute = caller.compute_s_per_day
    if compute is None:
        compute = defaults.max_compute_s_per_day
    if jobs is None and compute is None:
        return
    now = utcnow()
    start, next_day = usage.day_of(now)
    wait = (next_day - now).total_seconds()
    if jobs is not None:
        made = usage.jobs_made_since(session, tenant, start)  # (the new ones counted)
        if made > jobs:
            QUOTA_REFUSED.labels(tenant, "jobs_per_day").inc()
            raise too_many(
                "quota_jobs_per_day",
                f"{made - adding} jobs submitted today (UTC) and {adding} new: over the "
                f"quota of {jobs} a day for tenant {tenant!r}; nothing of this submission "
                "was kept",
                wait,
            )
    if compute is not None:
        used = usage.seconds_since(session, tenant, start)
        if used >= compute:
            QUOTA_REFUSED.labels(tenant, "compute_s_per_day").inc()
            raise too_many(
                "quota_compute_per_day",
                f"{used:.1f} model seconds used today (UTC): the quota of {compute:g} a day "
                f"for tenant {tenant!r} is spent; nothing of this submission was kept (work "
                "already running finishes)",
                wait,
            )
