"""Daily quotas per tenant: jobs submitted, and model seconds used (``GET /v1/usage``'s
figures), a UTC day at a time. A tenant's keys may set its quotas (``ApiKey.jobs_per_day``,
``compute_s_per_day``: the strictest of its live keys' applies, whichever key submits),
else the deployment's apply (``accounting.max_jobs_per_day``,
``accounting.max_compute_s_per_day``).

Checked inside the transaction that creates a submission's jobs (or requeues them: a
retry, a resume), after they were added, under the tenant's lock, so two submissions
at once are counted one after the other: a submission past a quota is refused whole
(429, ``Retry-After`` the next day, the quota and the figures in its detail) and nothing
of it is kept; work already running finishes. What the command line submits has no
tenant, and no quota; nor has anything with keys off (``api_require_keys`` false).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session

from api.deps import Caller, too_many
from api.metrics import QUOTA_REFUSED
from common.config import Settings
from common.store import keys, usage
from common.store.tables import utcnow


def check_quotas(session: Session, caller: Caller, settings: Settings, adding: int) -> None:
    """Refuse (429) ``adding`` new jobs of the caller's tenant past one of its quotas."""
    tenant = caller.tenant
    if tenant is None or not adding:
        return
    defaults = settings.accounting
    jobs, compute = keys.tenant_quotas(session, tenant)
    jobs = defaults.max_jobs_per_day if jobs is None else jobs
    compute = defaults.max_compute_s_per_day if compute is None else compute
    if jobs is None and compute is None:
        return
    usage.lock_tenant(session, tenant)
    now = utcnow()
    start, next_day = usage.day_of(now)
    wait = (next_day - now).total_seconds()
    if jobs is not None:
        made = usage.jobs_made_since(session, tenant, start)  # (the new ones counted)
        if made > jobs:
            QUOTA_REFUSED.labels(tenant, "jobs_per_day").inc()
            raise too_many(
                "quota_jobs_per_day",
                f"{made} jobs made today (UTC) with this submission's: over the quota of "
                f"{jobs} a day for tenant {tenant!r}; nothing of this submission was kept",
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


def quotas_of(caller: Caller, settings: Settings) -> Callable[[Session, int], None]:
    """The quota check of a retry or a resume (``common.pipeline.cancel``'s ``check``)."""
    return lambda session, adding: check_quotas(session, caller, settings, adding)
