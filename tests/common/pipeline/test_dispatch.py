"""Following a batch in the store: progress, and a store outage ridden out."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from common.pipeline import dispatch
from common.pipeline.dispatch import Watch, follow_store
from common.store import reads, submission
from common.store.tables import Job
from tests.helpers.store import items, new_batch


def test_following_rides_out_a_store_outage_and_says_so(sessions, monkeypatch):
    with sessions.begin() as session:
        batch = new_batch(session)
        submission.submit_items(session, batch, items("a"), "cfg")
        batch_id = batch.id
    with sessions() as session:
        finished = reads.batch_counts(session, batch_id)
    finished.by_status.clear()
    finished.by_status["done"] = 1  # (what the workers will have written)
    answers = iter(["down", "down", "down", finished])

    def counts(_sessions, _batch_id):
        answer = next(answers)
        if answer == "down":
            raise OperationalError("SELECT", {}, Exception("connection refused"))
        return answer

    monkeypatch.setattr(dispatch, "_counts", counts)
    monkeypatch.setattr(dispatch, "OUTAGE_REPORT_S", 0.0)
    monkeypatch.setattr(dispatch.time, "sleep", lambda _s: None)
    said: list[tuple[float, str | None]] = []
    result = follow_store(sessions, batch_id, Watch(on_outage=lambda s, why: said.append((s, why))))
    assert result.counts.finished == result.counts.jobs == 1 and not result.interrupted
    reasons = [why for _, why in said]
    assert reasons[:-1] == ["connection refused"] * 3 and reasons[-1] is None  # and back


class _Watching(dispatch.StoreOnly):
    """Sends nothing, but looks, at the moment of each send, at what another connection
    to the store sees of the jobs sent: a worker elsewhere sees only what is committed."""

    def __init__(self, sessions) -> None:
        super().__init__()
        self.sessions = sessions
        self.seen: list[list[str | None]] = []

    def send_fast(self, job_ids, **kwargs) -> int:
        ids = list(job_ids)
        with self.sessions() as elsewhere:  # (a connection of its own)
            found = {
                job.id: job.status for job in elsewhere.scalars(select(Job).where(Job.id.in_(ids)))
            }
        self.seen.append([found.get(job_id) for job_id in ids])
        return super().send_fast(ids, **kwargs)


def test_jobs_are_sent_only_once_their_transaction_has_committed(sessions):
    dispatcher = _Watching(sessions)
    with dispatcher.transaction(sessions) as tx:
        made: list[tuple[str, str]] = []
        submission.submit_items(
            tx.session, new_batch(tx.session), items("a", "b"), "c", created_jobs=made
        )
        tx.to_fast(job_id for job_id, _ in made)
    assert dispatcher.seen == [["queued", "queued"]]  # committed before the send
    with pytest.raises(RuntimeError), dispatcher.transaction(sessions) as tx:
        made = []
        submission.submit_items(
            tx.session, new_batch(tx.session, "k2"), items("c"), "c", created_jobs=made
        )
        tx.to_fast(job_id for job_id, _ in made)
        raise RuntimeError("the transaction fails")
    assert len(dispatcher.seen) == 1  # rolled back: nothing sent
