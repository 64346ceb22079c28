"""The accounting group: what model time is worth (``common.store.usage``), and each
tenant's daily quotas (``api.quotas``)."""

from __future__ import annotations

from common.config.base import Group, setting


class AccountingSettings(Group):
    """How a batch's usage is shown: in model seconds, and in money given a price."""

    price_per_gpu_hour: float | None = setting(
        None,
        "What an hour of model time costs (any currency: a GPU-hour on a GPU deployment). "
        "Set, a batch's usage also shows its cost and the money the funnel saved; unset, "
        "seconds only.",
        ge=0.0,
    )
    max_jobs_per_day: int | None = setting(
        None,
        "Jobs a tenant (an API key's) may submit a day, UTC; past it a submission is "
        "refused whole (429, Retry-After: the next day) and running work finishes. A key "
        "may set its own (speceyes keys create --jobs-per-day). Unset: no limit.",
        ge=0,
    )
    max_compute_s_per_day: float | None = setting(
        None,
        "Model seconds a tenant's jobs may use a day, UTC (what GET /v1/usage counts); once "
        "used, its submissions are refused (429) until the next day, and what runs "
        "finishes. A key may set its own (--compute-s-per-day). Unset: no limit.",
        ge=0.0,
    )
