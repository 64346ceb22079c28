"""Rows for the job store's tests: a batch, items to submit to it, a finished job."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from common.store import new_jobs, submission
from common.store.tables import Batch, Job


def new_batch(session, key: str = "k") -> Batch:
    batch, _ = submission.get_or_create_batch(session, key=key, name="b", source="src", config={})
    return batch


def items(*names: str, question: str = "Q?") -> list[new_jobs.NewItem]:
    return [
        new_jobs.NewItem(
            i, name, question, ["a", "b"], f"/img/{name}.png", image_hash=f"hash-{name}"
        )
        for i, name in enumerate(names)
    ]


def finished_job(session, tenant: str | None, finished_at: datetime, **usage: Any) -> Job:
    """A done job of ``tenant`` that finished at ``finished_at``, with the usage records
    given (``fast_usage``, ``agent_usage``, ``audit_usage``), added to ``session``."""
    key = uuid.uuid4().hex
    job = Job(
        id=key,
        idempotency_key=key,
        question="Q?",
        status="done",
        tenant=tenant,
        finished_at=finished_at,
        **usage,
    )
    session.add(job)
    return job
