"""A batch's results filtered and paged by cursor, and a tenant's jobs sent alone listed
the same way (``common.store.browse``)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from common.config import GateSettings
from common.contracts import Accepted, ScreenResult, Stage
from common.store import claims, submission
from common.store.browse import BadCursor, ResultFilter, Rows, results_page
from common.store.reviews import review_job, review_queue
from common.store.tables import Job
from tests.helpers.reviewing import decided_batch, picture
from tests.helpers.store import items


def _all_pages(session, batch_id: str, wanted: ResultFilter, limit: int) -> list[list[int]]:
    """Every page of the listing, by row position, following the cursors."""
    pages, cursor = [], None
    while True:
        page = results_page(session, batch_id, wanted, after=cursor, limit=limit)
        pages.append([row.item.position for row in page.rows])
        if page.next_cursor is None:
            return pages
        cursor = page.next_cursor


@pytest.fixture
def mixed(sessions, tmp_path: Path) -> tuple[str, list[dict]]:
    """37 rows: small and large answers, failures, ties and missing confidences."""
    draw = random.Random(7)
    rows = []
    for position in range(37):
        kind = position % 4
        if kind == 3:
            rows.append({"status": "failed", "error_code": "image_unreadable", "expected": "yes"})
        elif kind == 2:
            rows.append({"answered_by": "large", "final_answer": "no", "expected": "yes"})
        else:
            confidence = draw.choice([0.5, 0.75, 0.91, 0.91, 0.99])  # ties across pages
            rows.append(
                {
                    "answered_by": "small" if confidence >= 0.9 else "large",
                    "final_answer": "yes",
                    "confidence": confidence,
                    "expected": "yes",
                    "question": f"is the {'red' if position % 5 == 0 else 'blue'} thing here?",
                }
            )
    batch_id, _ = decided_batch(sessions, rows, picture(tmp_path))
    return batch_id, rows


@pytest.mark.parametrize("sort", ["position", "confidence", "-confidence"])
@pytest.mark.parametrize("limit", [1, 5, 36, 37, 50])
def test_the_pages_hold_every_row_once_in_order(sessions, mixed, sort: str, limit: int) -> None:
    batch_id, rows = mixed
    with sessions() as session:
        pages = _all_pages(session, batch_id, ResultFilter(sort=sort), limit)
    positions = [p for page in pages for p in page]
    assert all(len(page) == limit for page in pages[:-1]) and len(pages[-1]) <= limit
    assert sorted(positions) == list(range(len(rows)))
    if sort == "position":
        assert positions == list(range(len(rows)))
    else:  # by confidence (ties by row), rows without one last in row order

        def key(p: int) -> tuple:
            confidence = rows[p].get("confidence")
            signed = -confidence if sort == "-confidence" and confidence is not None else confidence
            return (confidence is None, signed or 0, p)

        assert positions == sorted(positions, key=key)


@pytest.mark.parametrize(
    ("wanted", "expect"),
    [
        (ResultFilter(who="small"), lambda r: r.get("answered_by") == "small"),
        (ResultFilter(who="none"), lambda r: r.get("answered_by") is None),
        (ResultFilter(status="failed"), lambda r: r.get("status") == "failed"),
        (ResultFilter(reason="image_unreadable"), lambda r: r.get("status") == "failed"),
        (
            ResultFilter(conf_min=0.7, conf_max=0.95),
            lambda r: 0.7 <= (r.get("confidence") or -1) <= 0.95,
        ),
        (ResultFilter(text="RED"), lambda r: "red" in r.get("question", "")),
        (
            ResultFilter(wrong=True),  # the agent's "no" against "yes"; a failure is wrong too
            lambda r: r.get("final_answer") == "no" or r.get("status") == "failed",
        ),
    ],
)
def test_a_filter_keeps_exactly_its_rows(sessions, mixed, wanted: ResultFilter, expect) -> None:
    batch_id, rows = mixed
    with sessions() as session:
        pages = _all_pages(session, batch_id, wanted, limit=4)
    assert [p for page in pages for p in page] == [p for p, r in enumerate(rows) if expect(r)]


def test_wrong_judges_by_the_scoring_rules_not_the_text(sessions, tmp_path: Path) -> None:
    rows = [
        {"final_answer": "B", "options": ["cat", "dog"], "expected": "dog"},  # right, by letter
        {"final_answer": "A", "options": ["cat", "dog"], "expected": "dog"},  # wrong
        {"final_answer": "Yes, it is.", "expected": "yes"},  # right, by the first word
    ]
    batch_id, _ = decided_batch(sessions, rows, picture(tmp_path))
    with sessions() as session:
        page = results_page(session, batch_id, ResultFilter(wrong=True))
        assert [row.item.position for row in page.rows] == [1]
        assert page.next_cursor is None


def test_reviewed_and_disagreeing_rows_are_found(sessions, tmp_path: Path) -> None:
    rows = [
        {"answered_by": "small", "final_answer": "yes", "confidence": 0.95, "audit_agrees": False},
        {"answered_by": "small", "final_answer": "yes", "confidence": 0.95, "audit_agrees": True},
        {"answered_by": "large", "final_answer": "no"},
    ]
    batch_id, ids = decided_batch(sessions, rows, picture(tmp_path))
    with sessions.begin() as session:
        review_job(session, session.get(Job, ids[2]), "maybe", "alice")
    with sessions() as session:

        def listed(wanted: ResultFilter) -> list[int]:
            return [row.item.position for row in results_page(session, batch_id, wanted).rows]

        assert listed(ResultFilter(disagree=True)) == [0]
        assert listed(ResultFilter(reviewed=True)) == [2]
        assert listed(ResultFilter(reviewed=False)) == [0, 1]
        assert listed(ResultFilter(text="maybe")) == [2]  # the reviewed answer is searched


@pytest.mark.parametrize("cursor", ["x", "p", "pfoo", "c0.5", "cnan:3", "n:"])
def test_a_cursor_not_of_the_listing_is_refused(sessions, mixed, cursor: str) -> None:
    batch_id, _ = mixed
    with sessions() as session, pytest.raises(BadCursor):
        results_page(session, batch_id, ResultFilter(sort="confidence"), after=cursor)


def test_the_jobs_a_tenant_sent_alone_list_as_a_batchs_rows(sessions):
    """Only the tenant's single jobs (not its batches', not another tenant's), oldest
    first, paged by cursor, filtered and sorted as a batch's; and their review queue."""
    with sessions.begin() as session:
        mine = [
            submission.submit_job(session, item, client_key=None, batch_id=None, tenant="team").id
            for item in items("a", "b", "c")
        ]
        for item in items("x"):
            submission.submit_job(session, item, client_key=None, batch_id=None, tenant="other")
        submission.submit_batch(session, items("y"), name="b", client_key=None, tenant="team")
        tickets = {t.job_id: t for t in claims.claim(session, Stage.FAST, 10)}
        answers = [
            Accepted(job_id, "red", confidence, [9.0], ScreenResult(False, "no"))
            for job_id, confidence in zip(mine, (0.99, 0.91, 0.95), strict=True)
        ]
        claims.record_fast(session, answers, GateSettings(threshold=0.9))
        claims.release_ids(
            session, [i for i in tickets if i not in mine], Stage.FAST, count_attempt=False
        )
    alone = Rows.alone("team")
    with sessions() as session:
        pages, cursor = [], None
        while True:
            page = results_page(session, alone, ResultFilter(), after=cursor, limit=2)
            pages.append([row.job.id for row in page.rows])
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert pages == [mine[:2], mine[2:]]
        assert [
            row.item.item_id for row in results_page(session, alone, ResultFilter()).rows
        ] == mine
        by_confidence = results_page(session, alone, ResultFilter(sort="-confidence")).rows
        assert [row.job.id for row in by_confidence] == [mine[0], mine[2], mine[1]]
        assert (
            results_page(session, alone, ResultFilter(text=mine[1][-8:])).rows[0].job.id == mine[1]
        )
        assert results_page(session, alone, ResultFilter(wrong=True)).rows == []  # (nothing known)
        everyone = results_page(session, Rows.alone(None, everyone=True), ResultFilter()).rows
        assert len(everyone) == 4
        with pytest.raises(BadCursor):
            results_page(session, alone, ResultFilter(), after="p7")  # (a batch's cursor)
        queue = review_queue(session, alone)
        assert [entry.job.id for entry in queue] == [mine[1], mine[2], mine[0]]  # nearest tau first
