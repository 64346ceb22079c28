"""Servers of our own for fault tests (never the machine's Redis or PostgreSQL), and a
supervisor that restarts exited workers as compose's restart policy would.

``OwnRedis`` runs ``redis-server`` without persistence on a free port: a restart loses
every message. ``OwnPostgres`` runs a scratch cluster (``initdb``; as the ``postgres``
user when we are root) on a free port. Both stop what they started.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

from sqlalchemy import select

from common.config import Settings
from common.contracts import JobStatus
from common.pipeline.dispatch import send_waiting
from common.pipeline.follow import follow_store
from common.pipeline.submit import submit_corpus
from common.store.db import open_store
from common.store.tables import Job
from lab.ports import free_port
from tests.helpers.images import write_images
from tests.helpers.waiting import wait_until
from tests.helpers.workers import WorkerProcess
from workers.queues import CeleryDispatcher


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class OwnRedis:
    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.folder = folder
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        command = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.folder),
        ]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        wait_until(lambda: _answers(self.port), deadline_s=20, what="our redis-server")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()  # no persistence: everything in it is gone
            self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


class OwnPostgres:
    """A scratch cluster in a folder of its own under the system's temp dir (pytest's
    folders are private to us, and the server may run as another user); ``close``
    removes it."""

    def __init__(self) -> None:
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="speceyes-pg-"))
        self.folder.chmod(0o777)
        self.data = self.folder / "pgdata"
        self.log = self.folder / "postgres.log"
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb")) or [shutil.which("initdb")]
        if found[-1] is None:
            raise RuntimeError(
                "no initdb on this machine: the fault tests run a PostgreSQL cluster of their "
                "own (apt-get install postgresql)"
            )
        self.bin = Path(str(found[-1])).parent
        self.as_postgres = os.geteuid() == 0  # initdb refuses to run as root

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *command: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if self.as_postgres else []
        subprocess.run(
            [*prefix, *command], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def init(self) -> None:
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "start",
        )

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(
                str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"
            )

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


class Supervised:
    """Workers kept running: one that exits is started again (compose's ``restart``)."""

    def __init__(self, env: dict[str, str], folder: Path) -> None:
        self.env, self.folder = env, folder
        self.workers: list[WorkerProcess] = []
        self.pools: list[tuple[str, tuple[str, ...]]] = []
        self.restarts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self, pool: str, *extra: str) -> WorkerProcess:
        self.pools.append((pool, extra))
        self.workers.append(self._spawn(len(self.workers)))
        self.workers[-1].wait_ready()
        return self.workers[-1]

    def supervise(self) -> None:
        self._thread.start()

    def _spawn(self, index: int) -> WorkerProcess:
        pool, extra = self.pools[index]
        log = self.folder / f"worker-{pool}-{index}.log"
        return WorkerProcess(pool, self.env, log, *extra)

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            for index, worker in enumerate(self.workers):
                if worker.process.poll() is not None and not self._stop.is_set():
                    worker.log.close()
                    self.restarts += 1
                    self.workers[index] = self._spawn(index)

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text()[-3000:]}"
            for path in sorted(self.folder.glob("worker-*.log"))
        )

    def close(self) -> None:
        self._stop.set()
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.terminate()
        deadline = time.monotonic() + 30
        for worker in self.workers:
            try:
                worker.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
            worker.log.close()


# recovery settings scaled down from the defaults (30 s / 30 s / 120 s) to test speed
RECOVERY = {
    "SPECEYES_HEARTBEAT_S": "1",
    "SPECEYES_WORKER_DEAD_AFTER_S": "5",
    "SPECEYES_RECONCILE_INTERVAL_S": "1",
    "SPECEYES_RECONCILE_AFTER_S": "3",
    "SPECEYES_WORKER_STALL_EXIT_S": "10",
    "SPECEYES_VISIBILITY_TIMEOUT_S": "600",  # far beyond every bound below
    "SPECEYES_RETRY_DELAY_S": "0.5",
    "SPECEYES_RETRY_MAX_DELAY_S": "4",
    "SPECEYES_FAST_MAX_WAIT_S": "0.3",
}


class Run:
    """A corpus through supervised workers on the given broker and store, with
    ``recovery`` settings (the scaled-down ``RECOVERY``; ``{}``: the defaults)."""

    def __init__(
        self,
        tmp_path: Path,
        broker_url: str,
        database_url: str,
        *,
        recovery: dict[str, str] | None = None,
        **scripted,
    ) -> None:
        tag = uuid.uuid4().hex[:8]
        self.env = {
            "SPECEYES_BACKEND": "scripted",
            "SPECEYES_BROKER_URL": broker_url,
            "SPECEYES_BROKER_KEY_PREFIX": f"faults-{tag}:",
            "SPECEYES_FAST_QUEUE": f"fast-{tag}",
            "SPECEYES_SLOW_QUEUE": f"slow-{tag}",
            "SPECEYES_DATABASE_URL": database_url,
            **(RECOVERY if recovery is None else recovery),
            **{f"SPECEYES_SCRIPTED__{k.upper()}": str(v) for k, v in scripted.items()},
        }
        self.settings = Settings(
            backend="scripted",
            broker_url=broker_url,
            database_url=database_url,
            broker_key_prefix=self.env["SPECEYES_BROKER_KEY_PREFIX"],
            fast_queue=self.env["SPECEYES_FAST_QUEUE"],
            slow_queue=self.env["SPECEYES_SLOW_QUEUE"],
        )
        self.sessions = open_store(database_url)
        self.workers = Supervised(self.env, tmp_path)
        self.tmp_path = tmp_path

    def supervised(self, *pools: str) -> list[WorkerProcess]:
        """Start a worker of each pool, ready, then keep them running (restarting any
        that exits)."""
        started = [self.workers.start(pool) for pool in pools]
        self.workers.supervise()
        return started

    def submit(self, count: int) -> str:
        from common.sources.corpus import read_source

        folder = self.tmp_path / "corpus"
        write_images(folder, count)
        rows = read_source(folder, "What is it?")
        dispatcher = CeleryDispatcher(self.settings)
        try:
            submitted = submit_corpus(
                self.sessions, rows, source=str(folder), name="faults", settings=self.settings
            )
            with dispatcher.transaction(self.sessions) as outbox:
                send_waiting(outbox, submitted.batch_id)
        finally:
            dispatcher.close()
        return submitted.batch_id

    def jobs(self) -> list[Job]:
        with self.sessions() as session:
            return list(session.scalars(select(Job)))

    def answers(self) -> dict[str, tuple]:
        return {
            j.id: (j.final_answer, j.answered_by, j.finished_at)
            for j in self.jobs()
            if j.status == JobStatus.DONE
        }

    def finish(self, batch_id: str, bound_s: float, before: dict[str, tuple]) -> float:
        """Wait (at most ``bound_s``) for every job to be final; check it all."""
        started = time.monotonic()
        result = follow_store(self.sessions, batch_id, poll_s=0.25, deadline_s=bound_s)
        took = time.monotonic() - started
        assert result.counts.finished == result.counts.jobs, (result.counts, self.workers.logs())
        jobs = self.jobs()
        assert {job.status for job in jobs} == {JobStatus.DONE}, self.workers.logs()
        after = self.answers()
        assert {job_id: after[job_id] for job_id in before} == before  # never rewritten
        return took

    def close(self) -> None:
        self.workers.close()
        self.sessions.close()
