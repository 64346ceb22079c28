"""Rows for the job store's tests: a batch, and items to submit to it."""

from __future__ import annotations

from common.store import new_jobs, submission
from common.store.tables import Batch


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
