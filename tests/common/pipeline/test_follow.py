"""Following a batch in the store: progress, and a store outage ridden out."""

from __future__ import annotations

from sqlalchemy.exc import OperationalError

from common.pipeline import follow
from common.pipeline.follow import Watch, follow_store
from common.store import reads, submission
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

    monkeypatch.setattr(follow, "_counts", counts)
    monkeypatch.setattr(follow, "OUTAGE_REPORT_S", 0.0)
    monkeypatch.setattr(follow.time, "sleep", lambda _s: None)
    said: list[tuple[float, str | None]] = []
    result = follow_store(sessions, batch_id, Watch(on_outage=lambda s, why: said.append((s, why))))
    assert result.counts.finished == result.counts.jobs == 1 and not result.interrupted
    reasons = [why for _, why in said]
    assert reasons[:-1] == ["connection refused"] * 3 and reasons[-1] is None  # and back
