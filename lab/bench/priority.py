"""How long a single high-priority job waits while a large corpus waits before it
(issue 46): the embedded runner at zero model cost (the scripted backend) over a store
holding ``waiting`` queued jobs, then one job sent at high priority. Its wait is from
its commit to its answer; for contrast, how long a normal job sent then would have
waited, from the corpus left ahead of it and the pace measured meanwhile."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from PIL import Image
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from common.backends import Models
from common.backends.scripted import ScriptedSettings, scripted_from_settings
from common.config import Settings
from common.contracts import JobStatus, Priority
from common.images import content_hash
from common.pipeline.runner import EmbeddedRunner
from common.store import submission
from common.store.db import open_store
from common.store.new_jobs import NewItem, insert_jobs, job_row
from common.store.tables import Job, utcnow
from lab.bench.scratch import scratch_store

CHUNK = 5000  # queued jobs written per transaction


@dataclass(frozen=True)
class PriorityFigures:
    waiting: int  # queued jobs when the single job was sent
    wait_s: float  # the high job's wait, commit to answer
    pace: float  # corpus jobs finished a second meanwhile
    normal_wait_s: float  # what a normal job sent then would have waited (estimated)
    seed_s: float


def measure(waiting: int, database_url: str | None, batch_size: int = 32) -> PriorityFigures:
    with scratch_store(database_url) as url:
        sessions = open_store(url)
        try:
            return _measure(sessions, waiting, batch_size)
        finally:
            sessions.close()


def _measure(sessions: sessionmaker[Session], waiting: int, batch_size: int) -> PriorityFigures:
    with tempfile.TemporaryDirectory(prefix="speceyes-bench-") as folder:
        image = Path(folder) / "tiny.png"
        Image.new("RGB", (32, 32), (20, 140, 90)).save(image)
        digest = content_hash(image.read_bytes())
        started = time.perf_counter()
        _seed(sessions, waiting, str(image), digest)
        seed_s = time.perf_counter() - started
        settings = Settings(
            backend="scripted", database_url="sqlite://", fast_batch_size=batch_size
        )
        model = scripted_from_settings(ScriptedSettings())  # zero cost, every job tool-free
        runner = EmbeddedRunner(sessions, Models(model, model), settings)
        runner.serve()
        try:
            _wait_for(lambda: _done(sessions) >= batch_size, "the corpus to start")
            before, then = _done(sessions), time.perf_counter()
            item = NewItem(0, "alone", "Is it green?", image_path=str(image), image_hash=digest)
            with sessions.begin() as session:
                job_id = submission.submit_job(
                    session,
                    replace(item, priority=Priority.HIGH.rank),
                    client_key=None,
                    batch_id=None,
                ).id
            _wait_for(lambda: _status(sessions, job_id) == JobStatus.DONE, "the single job")
            with sessions() as session:
                job = session.get(Job, job_id)
                assert job is not None and job.finished_at is not None
                wait_s = (job.finished_at - job.created_at).total_seconds()
            pace = (_done(sessions) - before) / max(time.perf_counter() - then, 1e-9)
        finally:
            runner.stop()
            runner.close()
    left = waiting - before
    return PriorityFigures(left, wait_s, pace, left / pace if pace else float("inf"), seed_s)


def _seed(sessions: sessionmaker[Session], waiting: int, image: str, digest: str) -> None:
    """``waiting`` queued normal jobs (one corpus, as a bulk submission writes them)."""
    now = utcnow()
    for start in range(0, waiting, CHUNK):
        rows = [
            job_row(
                NewItem(i, f"row-{i}", f"Is it green? #{i}", image_path=image, image_hash=digest),
                f"bench-priority-{i}",
                None,
                "speceyes",
                now,
            )
            for i in range(start, min(waiting, start + CHUNK))
        ]
        with sessions.begin() as session:
            insert_jobs(session, rows)


def _done(sessions: sessionmaker[Session]) -> int:
    with sessions() as session:
        done = select(func.count()).select_from(Job).where(Job.status == JobStatus.DONE)
        return session.scalar(done) or 0


def _status(sessions: sessionmaker[Session], job_id: str) -> str | None:
    with sessions() as session:
        job = session.get(Job, job_id)
        return None if job is None else job.status


def _wait_for(condition: Callable[[], bool], what: str, deadline_s: float = 600.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {deadline_s:.0f} s for {what}")
        time.sleep(0.05)  # (polling the store: its rows are the progress)
