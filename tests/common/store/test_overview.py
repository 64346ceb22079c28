"""A batch's overview: scores per split, the gate's confidences drawn against tau, and
a kept overview recomputed once the batch changes (``common.store.overview``)."""

from __future__ import annotations

from pathlib import Path

from common.store.overview import overview
from common.store.tables import Job
from tests.helpers.reviewing import decided_batch, picture


def test_the_overview_scores_draws_and_follows_changes(sessions, tmp_path: Path) -> None:
    rows = [
        {"answered_by": "small", "final_answer": "yes", "confidence": 0.95, "expected": "yes"},
        {"answered_by": "small", "final_answer": "yes", "confidence": 0.97, "expected": "no"},
        {
            "answered_by": "large",
            "final_answer": "no",
            "confidence": 0.42,
            "expected": "no",
            "small_answer": "yes",
        },
        {"answered_by": "large", "final_answer": "no", "split": "pope/random", "expected": "no"},
    ]
    batch_id, ids = decided_batch(sessions, rows, picture(tmp_path))
    with sessions() as session:
        found = overview(session, batch_id)
        assert (found.scored, found.correct) == (4, 3)
        assert [(s.split, s.rows, s.strict_correct) for s in found.splits] == [
            ("pope/random", 1, 1)
        ]
        bins = found.histogram.bins
        assert bins["accepted_right"][19] == 1 and bins["accepted_wrong"][19] == 1
        assert bins["deferred_wrong"][8] == 1  # the small model's "yes" at 0.42, deferred
        assert found.histogram.threshold == 0.9
    with sessions.begin() as session:
        session.get(Job, ids[1]).final_answer = "no"
        session.get(Job, ids[1]).finished_at = session.get(Job, ids[3]).finished_at.replace(
            year=2027
        )
    with sessions() as session:
        assert overview(session, batch_id).correct == 4  # recomputed: a job finished anew


def test_a_thread_whose_store_fails_says_so_and_a_later_read_asks_again(caplog) -> None:
    """The pass a thread makes for a large batch (``overview_soon``) meets a store that
    is down or a database that is gone: a warning, no thread dying with a traceback, and
    the batch is no longer 'being made', so the next read starts a pass again."""
    from sqlalchemy.exc import OperationalError

    from common.store import overview as module

    def down() -> None:
        raise OperationalError("SELECT 1", {}, Exception("server closed the connection"))

    module._MAKING.add("b1")
    module._make(down, "b1")  # type: ignore[arg-type]

    assert "b1" not in module._MAKING
    assert "the overview of batch b1 was not made" in caplog.text
