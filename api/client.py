"""The Python client of the SpecEyes HTTP API: ``speceyes_client`` (client/, the
speceyes-client distribution, httpx only), re-exported so that ``from api.client import
SpecEyesClient`` keeps working. The speceyes distribution ships that package too."""

from speceyes_client import (
    FINISHED,
    ApiClientError,
    Conflict,
    InvalidRequest,
    LimitExceeded,
    NotFound,
    RateLimited,
    ServerError,
    SpecEyesClient,
    Submitted,
    Timeout,
    Unauthorized,
)

__all__ = [
    "FINISHED",
    "ApiClientError",
    "Conflict",
    "InvalidRequest",
    "LimitExceeded",
    "NotFound",
    "RateLimited",
    "ServerError",
    "SpecEyesClient",
    "Submitted",
    "Timeout",
    "Unauthorized",
]
