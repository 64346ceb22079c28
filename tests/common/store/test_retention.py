"""Retention (``common.store.retention``): what a prune removes, and what it never does."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select, update

from common.contracts import JobStatus
from common.store import submission
from common.store.retention import prune
from common.store.tables import Batch, BatchItem, Job
from tests.helpers.store import items, new_batch

NOW = datetime(2026, 12, 4, tzinfo=UTC)
OLD, RECENT = NOW - timedelta(days=90), NOW - timedelta(days=1)
CUTOFF = NOW - timedelta(days=30)


def batch_of(session, key: str, *names: str) -> str:
    batch = new_batch(session, key)
    submission.submit_items(session, batch, items(*names), "cfg")
    return batch.id


def set_job(session, batch_id: str, name: str, status: str, finished=None, **values) -> None:
    job_id = session.scalar(
        select(BatchItem.job_id).where(BatchItem.batch_id == batch_id, BatchItem.item_id == name)
    )
    session.execute(
        update(Job).where(Job.id == job_id).values(status=status, finished_at=finished, **values)
    )


def names_left(session) -> dict[str, list[str]]:
    rows = session.execute(select(Batch.key, BatchItem.item_id).join(BatchItem)).all()
    found: dict[str, list[str]] = {}
    for key, name in rows:
        found.setdefault(key, []).append(name)
    return {key: sorted(names) for key, names in found.items()}


def corpus(sessions) -> None:
    """Four batches: finished long ago and lately; an open one holding an old finished
    job; a reviewed one; a queued one."""
    with sessions.begin() as session:
        mixed = batch_of(session, "mixed", "old-done", "old-failed", "recent-done")
        set_job(session, mixed, "old-done", JobStatus.DONE, OLD)
        set_job(session, mixed, "old-failed", JobStatus.FAILED, OLD)
        set_job(session, mixed, "recent-done", JobStatus.DONE, RECENT)
        open_ = batch_of(session, "open", "open-old", "open-waiting")
        set_job(session, open_, "open-old", JobStatus.DONE, OLD)
        set_job(session, open_, "open-waiting", JobStatus.DEFERRED)
        reviewed = batch_of(session, "reviewed", "labelled")
        set_job(session, reviewed, "labelled", JobStatus.DONE, OLD, reviewed_at=OLD)
        cancelled = batch_of(session, "cancelled", "old-cancelled", "running")
        set_job(session, cancelled, "old-cancelled", JobStatus.CANCELLED, OLD)
        set_job(session, cancelled, "running", JobStatus.RUNNING)


def test_finished_jobs_go_with_their_rows_and_nothing_open_is_touched(sessions):
    corpus(sessions)
    done = prune(sessions, before=CUTOFF)
    assert (done.jobs, done.batch_rows, done.batches) == (3, 3, 1)
    with sessions() as session:
        assert names_left(session) == {
            "mixed": ["recent-done"],  # (finished after the date)
            "open": ["open-old", "open-waiting"],  # (a job waits in it: all kept)
            "cancelled": ["old-cancelled", "running"],  # (one runs)
        }
        assert session.scalar(select(Batch.id).where(Batch.key == "reviewed")) is None
        assert len(session.scalars(select(Job.id)).all()) == 5
    assert prune(sessions, before=CUTOFF).jobs == 0  # (again: nothing left to remove)


def test_reviewed_jobs_are_kept_on_request_and_a_dry_run_removes_nothing(sessions):
    corpus(sessions)
    assert prune(sessions, before=CUTOFF, keep_reviewed=True, dry_run=True).jobs == 2
    with sessions() as session:
        assert len(session.scalars(select(Job.id)).all()) == 8
    assert prune(sessions, before=CUTOFF, keep_reviewed=True).jobs == 2
    with sessions() as session:
        assert names_left(session)["reviewed"] == ["labelled"]


def test_uploaded_images_go_with_the_last_job_that_names_them(sessions, tmp_path: Path):
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    lone, shared, outside = uploads / "lone.png", uploads / "shared.png", tmp_path / "mine.png"
    for path in (lone, shared, outside):
        path.write_bytes(b"png")
    with sessions.begin() as session:
        old = batch_of(session, "old", "a", "b", "c")
        for name, path in (("a", lone), ("b", shared), ("c", outside)):
            set_job(session, old, name, JobStatus.DONE, OLD, image_path=str(path))
        recent = batch_of(session, "recent", "d")
        set_job(session, recent, "d", JobStatus.DONE, RECENT, image_path=str(shared))
    done = prune(sessions, before=CUTOFF, upload_dir=uploads)
    assert done.jobs == 3 and done.images == 1
    assert not lone.exists()  # (no job names it now)
    assert shared.exists()  # (a job still does)
    assert outside.exists()  # (not ours: a corpus's own file is never removed)


def test_db_prune_says_what_it_removed_and_refuses_a_date_it_cannot_read(
    database_url, sessions, capsys, tmp_path: Path, monkeypatch
):
    import pytest

    from cli.main import main

    corpus(sessions)
    monkeypatch.setenv("SPECEYES_UPLOAD_DIR", str(tmp_path / "uploads"))
    argv = ["db", "prune", "--finished-before", CUTOFF.date().isoformat(), "--db", database_url]
    assert main([*argv, "--dry-run"]) == 0
    assert "3 jobs finished before 2026-11-04T00:00:00+00:00 would be removed" in (
        capsys.readouterr().out
    )
    assert main([*argv, "--keep-reviewed"]) == 0
    assert "removed 2 jobs finished before" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["db", "prune", "--finished-before", "last tuesday", "--db", database_url])
    assert "is not an ISO date or time" in capsys.readouterr().err
