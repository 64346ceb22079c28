"""How jobs and batches are named: ids that sort in the order they were made, and
idempotency keys (the same request is the same job), scoped to their tenant."""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from typing import Any


def idempotency_key(*parts: Any) -> str:
    """A stable key from JSON-able parts (content hash, question, options, settings)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


_last_micros = 0
_id_lock = threading.Lock()


def new_id() -> str:
    """A new id: 32 hex digits, microseconds since the epoch then 72 random bits, so ids
    made by one process sort in the order they were made (jobs written in one statement
    share ``created_at``: claims take them in id order, which is the corpus's)."""
    global _last_micros
    with _id_lock:
        _last_micros = max(time.time_ns() // 1000, _last_micros + 1)
        micros = _last_micros
    return f"{micros:014x}{secrets.token_hex(9)}"


def client_job_key(client_key: str, tenant: str | None) -> str:
    """The job key of a client's idempotency key: one namespace per tenant."""
    return idempotency_key("client", client_key, *scope(tenant))


def scope(tenant: str | None) -> tuple[str, ...]:
    # no tenant (keys off, or rows from before tenants): the key as it always was
    return () if tenant is None else (f"tenant:{tenant}",)
