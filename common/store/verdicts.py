"""The judge's verdicts on benchmark rows: written as they come (``common.evaluation.judge``)."""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.orm import Session

from common.store.tables import BatchItem


def set_judge_verdict(session: Session, batch_id: str, position: int, verdict: bool) -> None:
    """Record a judge's verdict on one row of a batch."""
    session.execute(
        update(BatchItem)
        .where(BatchItem.batch_id == batch_id, BatchItem.position == position)
        .values(judge_verdict=verdict)
    )
