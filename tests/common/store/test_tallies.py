"""A batch's counts kept by triggers (migrations 0022, 0023: tallies written directly on
SQLite, changes folded in on PostgreSQL) equal the counts a pass over its jobs and rows
makes, through every kind of change: jobs changing any column the counts read, rows
added (a job twice in a batch, a job in two batches), removed, pointed at another job (a
resumed row) or given a judge's verdict, batches deleted, and a store upgraded with
batches already in it."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import and_, delete, false, func, insert, select, text, update

from common.contracts import JobStatus
from common.store import listing, reads, submission, tallies
from common.store.db import downgrade, is_postgres, migrate
from common.store.tables import Batch, BatchItem, Job
from common.store.tallies import BatchTally
from tests.helpers.store import items, new_batch

STATUSES = [*JobStatus]
START = datetime(2026, 12, 4, tzinfo=UTC)


def same(session, batch_id: str) -> None:
    kept, passed = (
        reads.tallied(session, batch_id),
        reads.counts_of(session, reads.batch_jobs(batch_id)),
    )
    rows = session.execute(
        select(func.count(), func.count(BatchItem.judge_verdict)).where(
            BatchItem.batch_id == batch_id
        )
    ).one()
    assert (kept.items, kept.verdicts) == tuple(rows)
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


def a_row(session, draw: random.Random) -> Any:
    """A condition naming one of the store's batch rows, drawn (none: it names nothing)."""
    rows = session.execute(select(BatchItem.batch_id, BatchItem.position)).all()
    if not rows:
        return false()
    batch_id, position = draw.choice(rows)
    return and_(BatchItem.batch_id == batch_id, BatchItem.position == position)


def test_kept_counts_equal_a_pass_through_every_kind_of_change(sessions):
    postgres = is_postgres(sessions.engine)
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
            elif roll < 0.76:  # a judge's verdict given, changed or taken back
                row = a_row(session, draw)
                verdict = draw.choice([None, True, False])
                session.execute(update(BatchItem).where(row).values(judge_verdict=verdict))
            elif roll < 0.82:  # a row pointed at another job (a resumed row)
                row = a_row(session, draw)
                session.execute(update(BatchItem).where(row).values(job_id=draw.choice(job_ids)))
            elif roll < 0.9:  # a row added (maybe the job's second in that batch)
                batch_id = draw.choice(batches)
                position = 1000 + step
                row = {"batch_id": batch_id, "position": position, "item_id": f"r{step}"}
                session.execute(insert(BatchItem).values(**row, job_id=draw.choice(job_ids)))
            else:  # a row removed
                session.execute(delete(BatchItem).where(a_row(session, draw)))
        if step % 50 == 49:  # (PostgreSQL: changes folded into the tallies, now and then)
            with sessions.begin() as session:
                moved = tallies.fold(session)
                assert moved > 0 if postgres else moved == 0
        with sessions() as session:
            for batch_id in batches:
                same(session, batch_id)
    with sessions.begin() as session:  # a batch deleted takes its rows and tallies along
        session.execute(delete(Batch).where(Batch.id == second.id))
    with sessions.begin() as session:
        tallies.fold(session)
    with sessions() as session:
        assert reads.tallied(session, second.id).jobs == 0
        same(session, first.id)
        assert session.scalar(select(func.count()).select_from(tallies.TallyChange)) == 0


def test_an_upgraded_store_counts_the_batches_it_already_held(sessions):
    with sessions.begin() as session:
        batch = new_batch(session)
        submission.submit_items(session, batch, items("a", "b", "a"), "cfg")
        session.execute(update(Job).values(status=JobStatus.DONE, answered_by="small"))
    downgrade(sessions.engine, "0021")  # (the tallies gone: a store from before them)
    with sessions.begin() as session:
        session.execute(update(Job).values(status=JobStatus.FAILED, error_code="image_error"))
        session.execute(update(BatchItem).where(BatchItem.position == 0).values(judge_verdict=True))
    migrate(sessions.engine)
    with sessions() as session:
        same(session, batch.id)
        counts = reads.tallied(session, batch.id)
        assert counts.failures == {"image_error": 2}
        assert (counts.items, counts.verdicts, counts.pending) == (3, 1, 0)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_postgresql_writers_append_changes_that_a_read_of_many_folds(sessions, monkeypatch):
    with sessions.begin() as session:
        batch = new_batch(session)
        submission.submit_items(session, batch, items("a", "b", "c"), "cfg")
    for status in (JobStatus.RUNNING, JobStatus.DONE, JobStatus.FAILED):
        with sessions.begin() as session:
            session.execute(update(Job).values(status=status))
    with sessions() as session:  # no writer touched a tally row: each appended its change
        assert session.scalar(select(func.count()).select_from(BatchTally)) == 0
        assert reads.tallied(session, batch.id).pending >= 4  # (the rows, then 3 updates)
    monkeypatch.setattr(tallies, "FOLD_AT", 3)
    with sessions() as session:  # a read that finds more than FOLD_AT folds them
        assert reads.batch_counts(session, batch.id).by_status == {JobStatus.FAILED: 3}
    with sessions() as session:
        counts = reads.tallied(session, batch.id)
        assert (counts.pending, counts.by_status, counts.items) == (0, {JobStatus.FAILED: 3}, 3)
        same(session, batch.id)
    with sessions.begin() as session:  # another fold holds the lock: this one waits for none
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": tallies.FOLD_LOCK})
        with sessions.begin() as other:
            assert tallies.fold(other) is None
