"""A batch's counts kept by triggers (SQLite, migration 0022) equal the counts a pass over
its jobs makes, through every kind of change: jobs changing any column the counts read,
rows added (a job twice in a batch, a job in two batches), removed and pointed at
another job (a resumed row), batches deleted, and a store upgraded with batches already
in it."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import delete, insert, select, update

from common.contracts import JobStatus
from common.store import listing, reads, submission
from common.store.db import downgrade, migrate, open_store
from common.store.tables import Batch, BatchItem, Job
from tests.helpers.store import items, new_batch

STATUSES = [*JobStatus]
START = datetime(2026, 12, 4, tzinfo=UTC)


def same(session, batch_id: str) -> None:
    kept, passed = (
        reads.tallied(session, batch_id),
        reads.counts_of(session, reads.batch_jobs(batch_id)),
    )
    for name in (
        "jobs",
        "by_status",
        "by_answerer",
        "by_defer_reason",
        "failures",
        "cancellations",
        "screened",
        "screened_tool_free",
        "speculated",
        "accepted",
        "audited",
        "audit_agreed",
        "reviewed",
    ):
        assert getattr(kept, name) == getattr(passed, name), name
    (line,) = listing.counted(session, [session.get(Batch, batch_id)])  # (the list's)
    assert (line.jobs, line.by_status) == (passed.jobs, passed.by_status)
    # high-water marks: never below what the jobs hold now
    if passed.last_finished is not None:
        assert kept.last_finished >= passed.last_finished
    if passed.first_started is not None:
        assert kept.first_started <= passed.first_started


def change(draw: random.Random) -> dict:
    """New values for some of the columns the counts read."""
    moment = START + timedelta(seconds=draw.randrange(10_000))
    choices = {
        "status": lambda: draw.choice(STATUSES),
        "answered_by": lambda: draw.choice([None, "small", "large"]),
        "defer_reason": lambda: draw.choice([None, "tools_needed", "low_confidence"]),
        "error_code": lambda: draw.choice([None, "image_error", "step_limit"]),
        "screen_needs_tools": lambda: draw.choice([None, True, False]),
        "confidence": lambda: draw.choice([None, 0.5, 0.97]),
        "audit_status": lambda: draw.choice([None, "pending", "done", "failed"]),
        "audit_agrees": lambda: draw.choice([None, True, False]),
        "fast_started_at": lambda: draw.choice([None, moment]),
        "finished_at": lambda: draw.choice([None, moment]),
        "reviewed_at": lambda: draw.choice([None, moment]),
        "question": lambda: f"Q{draw.randrange(9)}?",  # (not counted: no trigger work)
    }
    names = draw.sample(sorted(choices), draw.randint(1, 4))
    return {name: choices[name]() for name in names}


def test_kept_counts_equal_a_pass_through_every_kind_of_change(tmp_path):
    sessions = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    draw = random.Random(49)
    with sessions.begin() as session:
        first = new_batch(session, "first")
        second = new_batch(session, "second")
        # "a" twice in the first batch (one job), "a" and "b" in the second as well
        submission.submit_items(session, first, items("a", "b", "c", "a", "d"), "cfg")
        submission.submit_items(session, second, items("a", "b", "e"), "cfg")
        batches = [first.id, second.id]
        job_ids = sorted(session.scalars(select(Job.id)))
    for step in range(400):
        with sessions.begin() as session:
            roll = draw.random()
            if roll < 0.7:
                values = change(draw)
                session.execute(update(Job).where(Job.id == draw.choice(job_ids)).values(**values))
            elif roll < 0.82:  # a row pointed at another job (a resumed row)
                rows = session.execute(select(BatchItem.batch_id, BatchItem.position)).all()
                if rows:
                    batch_id, position = draw.choice(rows)
                    session.execute(
                        update(BatchItem)
                        .where(BatchItem.batch_id == batch_id, BatchItem.position == position)
                        .values(job_id=draw.choice(job_ids))
                    )
            elif roll < 0.9:  # a row added (maybe the job's second in that batch)
                batch_id = draw.choice(batches)
                position = 1000 + step
                row = {"batch_id": batch_id, "position": position, "item_id": f"r{step}"}
                session.execute(insert(BatchItem).values(**row, job_id=draw.choice(job_ids)))
            else:  # a row removed
                rows = session.execute(select(BatchItem.batch_id, BatchItem.position)).all()
                if rows:
                    batch_id, position = draw.choice(rows)
                    session.execute(
                        delete(BatchItem).where(
                            BatchItem.batch_id == batch_id, BatchItem.position == position
                        )
                    )
        with sessions() as session:
            for batch_id in batches:
                same(session, batch_id)
    with sessions.begin() as session:  # a batch deleted takes its rows and tallies along
        session.execute(delete(Batch).where(Batch.id == second.id))
    with sessions() as session:
        assert reads.tallied(session, second.id).jobs == 0
        same(session, first.id)
    sessions.close()


def test_an_upgraded_store_counts_the_batches_it_already_held(tmp_path):
    sessions = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    with sessions.begin() as session:
        batch = new_batch(session)
        submission.submit_items(session, batch, items("a", "b", "a"), "cfg")
        session.execute(update(Job).values(status=JobStatus.DONE, answered_by="small"))
    downgrade(sessions.engine, "0021")  # (the tallies gone: a store from before them)
    with sessions.begin() as session:
        session.execute(update(Job).values(status=JobStatus.FAILED, error_code="image_error"))
    migrate(sessions.engine)
    with sessions() as session:
        same(session, batch.id)
        assert reads.tallied(session, batch.id).failures == {"image_error": 2}
    sessions.close()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_postgresql_counts_by_a_pass_and_keeps_no_tallies(sessions):
    with sessions.begin() as session:
        batch = new_batch(session)
        submission.submit_items(session, batch, items("a", "b"), "cfg")
    with sessions() as session:
        assert reads.batch_counts(session, batch.id).jobs == 2
        assert reads.tallied(session, batch.id).jobs == 0  # (no triggers there)
