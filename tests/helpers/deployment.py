"""An isolated distributed deployment (its own PostgreSQL database, Redis key prefix and
queue names) whose Celery workers run as subprocesses on the scripted backend, each
job's route written in a scripts file. The ``deployment`` fixture makes them
(``tests/workers/conftest.py``)."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import select

from common.backends.scripted import JobScript
from common.config import Settings
from common.pipeline.dispatch import send_waiting
from common.pipeline.follow import follow_store
from common.pipeline.submit import submit_corpus
from common.sources.corpus import read_source
from common.store.db import open_store
from common.store.tables import BatchItem, Job
from tests.helpers.workers import WorkerProcess
from workers.queues import CeleryDispatcher


class Deployment:
    """One isolated deployment: settings, store, dispatcher, and the workers started."""

    def __init__(self, env: dict[str, str], tmp_path: Path) -> None:
        self.env = env
        self.tmp_path = tmp_path
        self.settings = Settings()  # from the SPECEYES_* environment the fixture set
        self.sessions = open_store(self.settings.database_url)
        self.dispatcher = CeleryDispatcher(self.settings)
        self.workers: list[WorkerProcess] = []

    def submit(self, folder: Path, question: str = "What is it?") -> str:
        rows = read_source(folder, question)
        submitted = submit_corpus(
            self.sessions, rows, source=str(folder), name="t", settings=self.settings
        )
        return submitted.batch_id

    def script(self, batch_id: str, by_item: dict[str, JobScript]) -> dict[str, str]:
        """Write the scripts of the batch's jobs; returns item -> job id."""
        with self.sessions() as session:
            rows = session.execute(
                select(BatchItem.item_id, BatchItem.job_id).where(BatchItem.batch_id == batch_id)
            )
            jobs = {item: job_id for item, job_id in rows}
        scripts = {jobs[item]: script.to_dict() for item, script in by_item.items()}
        path = self.tmp_path / "scripts.json"
        path.write_text(json.dumps(scripts))
        self.env["SPECEYES_SCRIPTED__SCRIPTS_FILE"] = str(path)
        return jobs

    def start(self, pool: str, *extra: str, wait: bool = True) -> WorkerProcess:
        log = self.tmp_path / f"worker-{pool}-{len(self.workers)}.log"
        worker = WorkerProcess(pool, self.env, log, *extra)
        self.workers.append(worker)
        if wait:
            worker.wait_ready()
        return worker

    def send(self, batch_id: str) -> None:
        """Send the batch's waiting jobs to the workers (as ``annotate`` does)."""
        with self.dispatcher.transaction(self.sessions) as outbox:
            send_waiting(outbox, batch_id)

    def follow(self, batch_id: str, deadline_s: float = 60.0):
        return follow_store(self.sessions, batch_id, poll_s=0.1, deadline_s=deadline_s)

    def run(self, batch_id: str, deadline_s: float = 60.0):
        self.send(batch_id)
        result = self.follow(batch_id, deadline_s)
        assert result.counts.finished == result.counts.jobs, (result.counts, self.logs())
        return result

    def jobs(self) -> dict[str, Job]:
        with self.sessions() as session:
            return {job.id: job for job in session.scalars(select(Job))}

    def logs(self) -> str:
        return "\n".join(w.log_path.read_text()[-2000:] for w in self.workers)

    def close(self) -> None:
        for worker in self.workers:  # all at once: each takes seconds to shut down warm
            if worker.process.poll() is None:
                worker.process.terminate()
        for worker in self.workers:
            worker.stop()
        self.dispatcher.close()
        self.sessions.close()
