"""The services the suite uses: the PostgreSQL and Redis this machine runs (and CI's).

Each test gets a database of its own on the server (``postgres_url``) and a key prefix
and queue names of its own on Redis (``broker_env``), so tests never see each other's
data, in one process or in parallel workers. Set the two variables to point elsewhere.
"""

from __future__ import annotations

import os

POSTGRES_ADMIN_URL = os.environ.get(
    "SPECEYES_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("SPECEYES_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
