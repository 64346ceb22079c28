"""Reviews kept beside the model's answer, the review queue's order, and reviewed rows as
calibration labels (``common.store.reviews``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import InvalidInput
from common.store import reviews
from common.store.analytics import calibration_items
from common.store.reviews import NotReviewable, review_job, review_queue
from common.store.tables import Job
from tests.helpers.reviewing import decided_batch, picture

TIERS = ("disagree", "near_threshold", "failed")


@pytest.fixture
def image(tmp_path: Path) -> Path:
    return picture(tmp_path)


def test_a_review_is_kept_beside_the_models_answer(sessions, image: Path) -> None:
    _, (job_id,) = decided_batch(sessions, [{"final_answer": "red", "answered_by": "large"}], image)
    with sessions.begin() as session:
        review_job(session, session.get(Job, job_id), "  blue ", "alice")
    with sessions() as session:
        job = session.get(Job, job_id)
        assert (job.final_answer, job.reviewed_answer, job.reviewer) == ("red", "blue", "alice")
        assert job.reviewed_at is not None and job.given_answer == "blue"
    with sessions.begin() as session:  # again: the later review stands, the model's stays
        review_job(session, session.get(Job, job_id), "green", "bob")
    with sessions() as session:
        job = session.get(Job, job_id)
        assert (job.final_answer, job.given_answer, job.reviewer) == ("red", "green", "bob")


@pytest.mark.parametrize(
    ("spec", "answer", "error"),
    [
        ({"status": "running", "final_answer": None}, "x", NotReviewable),
        ({"final_answer": "a"}, "   ", InvalidInput),
        ({"final_answer": "a"}, "x" * 2001, InvalidInput),
        ({"final_answer": "A", "options": ["cat", "dog"]}, "C", InvalidInput),
        ({"final_answer": "A", "options": ["cat", "dog"]}, "cow", InvalidInput),
        ({"final_answer": "A", "options": ["cat", "dog"]}, "\u00df", InvalidInput),  # ß: SS
        ({"final_answer": "a"}, "ye\x00s", InvalidInput),
    ],
)
def test_a_review_that_cannot_stand_is_refused_and_changes_nothing(
    sessions, image: Path, spec: dict, answer: str, error: type[Exception]
) -> None:
    _, (job_id,) = decided_batch(sessions, [spec], image)
    with sessions() as session, pytest.raises(error):
        review_job(session, session.get(Job, job_id), answer, "alice")
    with sessions() as session:
        assert session.get(Job, job_id).reviewed_at is None


def test_an_option_is_given_by_its_letter_or_its_text(sessions, image: Path) -> None:
    rows = [{"final_answer": "A", "options": ["cat", "dog"]}] * 2
    _, (first, second) = decided_batch(sessions, rows, image)
    with sessions.begin() as session:
        review_job(session, session.get(Job, first), "b", "alice")
        review_job(session, session.get(Job, second), "dog", "alice")
    with sessions() as session:  # kept as the option's text: one form in every export
        assert session.get(Job, first).reviewed_answer == "dog"
        assert session.get(Job, second).reviewed_answer == "dog"


def test_an_option_that_is_a_letter_is_taken_as_its_text(sessions, image: Path) -> None:
    _, (job_id,) = decided_batch(sessions, [{"final_answer": "A", "options": ["B", "A"]}], image)
    with sessions.begin() as session:
        review_job(session, session.get(Job, job_id), "A", "alice")  # the text "A", not B
    with sessions() as session:
        assert session.get(Job, job_id).reviewed_answer == "A"


def test_the_queue_puts_disagreements_then_closest_to_tau_then_failures(
    sessions, image: Path, monkeypatch
) -> None:
    small = {"answered_by": "small", "final_answer": "yes"}
    rows = [
        {**small, "confidence": 0.99},  # 0: far from tau
        {"status": "failed", "error_code": "image_unreadable", "final_answer": None},  # 1
        {**small, "confidence": 0.91},  # 2: closest to tau = 0.9
        {"answered_by": "large", "final_answer": "no"},  # 3: the agent's: not queued
        {**small, "confidence": 0.97, "audit_agrees": False, "audit_answer": "no"},  # 4
        {**small, "confidence": 0.93},  # 5
    ]
    batch_id, ids = decided_batch(sessions, rows, image)
    expected = [
        (4, "audit_disagrees"),
        (2, "near_threshold"),
        (5, "near_threshold"),
        (0, "near_threshold"),
        (1, "failed"),
    ]
    with sessions() as session:
        queue = review_queue(session, batch_id)
        assert [(entry.item.position, entry.why) for entry in queue] == expected
        assert [entry.item.position for entry in review_queue(session, batch_id, limit=2)] == [4, 2]
    for plan in (False, True):  # read in either way each tier may be (by the kept counts)
        monkeypatch.setattr(reviews, "_plans", lambda *_, plan=plan: dict.fromkeys(TIERS, plan))
        with sessions() as session:
            queue = review_queue(session, batch_id)
            assert [(entry.item.position, entry.why) for entry in queue] == expected
    monkeypatch.undo()
    with sessions.begin() as session:  # a reviewed job leaves the queue
        review_job(session, session.get(Job, ids[2]), "yes", "alice")
    with sessions() as session:
        assert 2 not in [entry.item.position for entry in review_queue(session, batch_id)]


def test_a_calibration_row_whose_agent_failed_counts_its_agent_wrong(sessions, image: Path):
    """A calibration run sends every speculated row to the agent too; where the agent
    failed, it has no answer, which our rules count wrong, in the gate sweep and the
    depth replay alike (the replay took no agent score for a right one)."""
    from common.evaluation.depth import _agent_right

    common = {"answered_by": "large", "confidence": 0.95, "defer_reason": "calibration"}
    rows = [
        {**common, "final_answer": "yes", "small_answer": "yes", "expected": "yes"},
        {
            **common,
            "status": "failed",
            "final_answer": None,
            "small_answer": "yes",
            "expected": "yes",
        },
    ]
    batch_id, _ids = decided_batch(sessions, rows, image)
    with sessions() as session:
        found = calibration_items(session, batch_id)
    assert [item.agent_right for item in found] == [True, False]
    assert [_agent_right(item) for item in found] == [True, False]


def test_a_reviewed_answer_is_a_label_for_calibration(sessions, image: Path) -> None:
    rows = [
        {"answered_by": "small", "final_answer": "yes", "confidence": 0.95},  # no label
        {"answered_by": "small", "final_answer": "yes", "confidence": 0.92, "expected": "yes"},
    ]
    batch_id, ids = decided_batch(sessions, rows, image)
    with sessions() as session:
        assert [item.right for item in calibration_items(session, batch_id)] == [True]
    with sessions.begin() as session:
        review_job(session, session.get(Job, ids[0]), "no", "alice")  # labels the first
        review_job(session, session.get(Job, ids[1]), "no", "alice")  # overrides expected
    with sessions() as session:
        found = calibration_items(session, batch_id)
        assert [(item.confidence, item.right) for item in found] == [(0.95, False), (0.92, False)]
