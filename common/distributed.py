"""Running a batch on the distributed pipeline: enqueue its jobs, follow them in the store.

The submitter's side of ``speceyes annotate`` with a broker: the jobs are already
committed (``common.submit``); this sends each unfinished one to its queue and then
watches the job store, where the workers record results, until every job has finished.
Interrupting stops the watching only: the jobs go on in the workers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from common.broker import Broker
from common.runner import Progress, RunResult
from common.store import jobs as store
from common.store.tables import DEFERRED, QUEUED

Stalled = Callable[[float], None]


class DistributedRunner:
    def __init__(self, sessions: sessionmaker[Session], broker: Broker) -> None:
        self.sessions = sessions
        self.broker = broker

    def enqueue(self, batch_id: str) -> tuple[int, int]:
        """Send the batch's waiting jobs to their queues; returns (fast, slow) sent.

        Sending again what may already be queued (a resumed run) is harmless: a worker
        handed a job that is no longer waiting for it does nothing.
        """
        with self.sessions() as session:
            queued = store.job_ids(session, batch_id, QUEUED)
            deferred = store.job_ids(session, batch_id, DEFERRED)
        return self.broker.send_fast(queued), self.broker.send_slow(deferred)

    def follow(
        self,
        batch_id: str,
        *,
        on_progress: Progress | None = None,
        on_stall: Stalled | None = None,
        poll_s: float = 0.5,
        stall_s: float = 30.0,
        deadline_s: float | None = None,
    ) -> RunResult:
        """Watch the store until the batch is finished (or Ctrl-C, or ``deadline_s``).

        ``on_stall(seconds)`` is called once each time nothing has finished for
        ``stall_s`` (no worker running, most likely).
        """
        started = time.perf_counter()
        counts = self.counts(batch_id)
        finished_before, last_change, last_finished, warned = (
            counts.finished, started, counts.finished, False,
        )  # fmt: skip
        try:
            while counts.finished < counts.jobs:
                if on_progress is not None:
                    on_progress(counts)
                now = time.perf_counter()
                if deadline_s is not None and now - started > deadline_s:
                    break
                if counts.finished != last_finished:
                    last_change, last_finished, warned = now, counts.finished, False
                elif not warned and now - last_change > stall_s and on_stall is not None:
                    on_stall(now - last_change)
                    warned = True
                time.sleep(poll_s)  # polling the store: its rows are the progress
                counts = self.counts(batch_id)
        except KeyboardInterrupt:
            result = RunResult(self.counts(batch_id), interrupted=True)
        else:
            result = RunResult(counts)
            if on_progress is not None:
                on_progress(counts)
        result.finished_now = result.counts.finished - finished_before
        result.seconds = time.perf_counter() - started
        return result

    def counts(self, batch_id: str) -> store.BatchCounts:
        with self.sessions() as session:
            return store.batch_counts(session, batch_id)
