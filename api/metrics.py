"""The API's own Prometheus metrics (``GET /metrics`` serves them with the process's)."""

from __future__ import annotations

from prometheus_client import Counter

SUBMITTED = Counter(
    "speceyes_api_jobs_submitted_total", "Jobs created through the API, by route.", ["route"]
)
REFUSED = Counter("speceyes_api_refused_total", "Requests answered 4xx, by error code.", ["error"])
UNSENT = Counter(
    "speceyes_api_unsent_total",
    "Jobs committed while the broker refused them (the reconciler sends them later).",
)
