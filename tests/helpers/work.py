"""Jobs for the work unit's tests: submitted from real image files, a stage over the
scripted model, the jobs as the store holds them, a job marked running since a while."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update

from common.backends import Models
from common.backends.scripted import JobScript, ScriptedModel
from common.config import Settings
from common.contracts import JobStatus, Stage
from common.images import content_hash
from common.pipeline.dispatch import StoreOnly
from common.pipeline.work import FastWork
from common.store import new_jobs, submission
from common.store.tables import BatchItem, Job, utcnow
from tests.helpers.images import write_images


def submit(sessions, tmp_path, count: int, method: str = "speceyes") -> list[str]:
    paths = write_images(tmp_path / "images", count)
    hashes = [content_hash(path.read_bytes()) for path in paths]
    items = [
        new_jobs.NewItem(i, f"item{i}", "What is it?", image_path=str(path), image_hash=digest)
        for i, (path, digest) in enumerate(zip(paths, hashes, strict=True))
    ]
    with sessions.begin() as session:
        batch, _ = submission.get_or_create_batch(session, key="b", name="b", source="s", config={})
        submission.submit_items(session, batch, items, "cfg", method)  # type: ignore[arg-type]
        return list(session.scalars(select(BatchItem.job_id).order_by(BatchItem.position)))


def stage(sessions, scripts: dict[str, JobScript], **settings) -> tuple[FastWork, ScriptedModel]:
    model = ScriptedModel(scripts)
    config = Settings(backend="scripted", visibility_timeout_s=60, **settings)
    return FastWork(sessions, Models(model, model), config, StoreOnly()), model


def jobs(sessions) -> dict[str, Job]:
    with sessions() as session:
        return {job.id: job for job in session.scalars(select(Job))}


def running_since(sessions, job_id: str, seconds_ago: float, stage_: Stage = Stage.FAST) -> None:
    started = utcnow() - timedelta(seconds=seconds_ago)
    column = "fast_started_at" if stage_ == Stage.FAST else "agent_started_at"
    with sessions.begin() as session:
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status=JobStatus.RUNNING, stage=stage_, attempts=1, **{column: started})
        )
