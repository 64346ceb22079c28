"""The embedded runner: the whole funnel in one process, over the job store.

Two kinds of thread work the same database side by side:

- the **fast stage** (one thread) claims queued jobs in micro-batches, runs phases I-III
  (``run_fast_stage``) and records each batch in one transaction: accepted answers are
  final the moment their batch is gated; deferred jobs become ``deferred``;
- the **agent stage** (``agent_workers`` threads) claims deferred jobs one at a time and
  runs phase IV (``run_agent_stage``), so a slow trajectory never holds up the fast stage.

The database is the queue: a job is claimed by moving it to ``running`` and finished by a
conditional write, so a restarted run (after Ctrl-C or a crash) releases ``running`` jobs
back to ``queued`` / ``deferred`` and nothing is lost or recorded twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from common.agents.deepeyes import AgentLimits
from common.backends import Models
from common.backends.base import Query
from common.config import Settings
from common.funnel import (
    Deferred,
    Failed,
    FastOutcome,
    FunnelSettings,
    run_agent_stage,
    run_fast_stage,
)
from common.store import jobs as store
from common.store.jobs import BatchCounts, Ticket
from common.store.tables import DEFERRED, QUEUED

log = logging.getLogger(__name__)

Progress = Callable[[BatchCounts], None]


@dataclass
class RunResult:
    counts: BatchCounts
    interrupted: bool = False
    released: int = 0  # in-flight jobs put back on an interrupt
    finished_now: int = 0  # jobs this run took to done / failed
    seconds: float = 0.0


class EmbeddedRunner:
    """Runs one batch through the funnel with a fast thread and agent threads."""

    def __init__(self, sessions: sessionmaker[Session], models: Models, settings: Settings) -> None:
        self.sessions = sessions
        self.models = models
        self.settings = settings
        self.funnel = FunnelSettings.from_settings(settings)
        self.limits = AgentLimits.from_settings(settings)
        self._stop = threading.Event()
        self._wake = threading.Event()  # new work was submitted (serving)
        self._serving = False
        self._fast_done = threading.Event()
        self._deferred_ready = threading.Condition()
        self._errors: list[BaseException] = []
        # Held while claiming and while an interrupt puts running jobs back, so no claim
        # can slip in after the release (it would leave a job ``running`` on exit).
        self._claiming = threading.Lock()

    def run(
        self, batch_id: str, *, on_progress: Progress | None = None, poll_s: float = 0.5
    ) -> RunResult:
        """Work the batch until every job is done or failed, or until interrupted."""
        started = time.perf_counter()
        with self.sessions.begin() as session:
            released = store.release_running(session, batch_id)
            finished_before = store.batch_counts(session, batch_id).finished
        if released:
            log.info("released %d jobs left running by an earlier run", released)
        threads = [self._thread("fast-stage", self._fast_loop, batch_id)]
        threads += [
            self._thread(f"agent-{i}", self._agent_loop, batch_id)
            for i in range(self.settings.agent_workers)
        ]
        try:
            while any(thread.is_alive() for thread in threads):
                if on_progress is not None:
                    on_progress(self.counts(batch_id))
                self._stop.wait(poll_s)
        except KeyboardInterrupt:
            result = self._interrupt(batch_id, threads)
        else:
            if self._errors:
                raise self._errors[0]
            result = RunResult(self.counts(batch_id))
            if on_progress is not None:
                on_progress(result.counts)
        result.finished_now = result.counts.finished - finished_before
        result.seconds = time.perf_counter() - started
        return result

    def serve(self) -> list[threading.Thread]:
        """Work every job of the store, as it arrives, until ``stop()`` (``speceyes serve``
        without a broker). Returns the started threads."""
        with self.sessions.begin() as session:
            released = store.release_running(session)
        if released:
            log.info("released %d jobs left running by an earlier run", released)
        self._serving = True
        threads = [self._thread("fast-stage", self._fast_loop, None)]
        threads += [
            self._thread(f"agent-{i}", self._agent_loop, None)
            for i in range(self.settings.agent_workers)
        ]
        return threads

    def notify(self) -> None:
        """New jobs are queued: stop waiting for them."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        with self._deferred_ready:
            self._deferred_ready.notify_all()

    def counts(self, batch_id: str) -> BatchCounts:
        with self.sessions() as session:
            return store.batch_counts(session, batch_id)

    # -- internals ------------------------------------------------------------------
    def _thread(
        self, name: str, loop: Callable[[str | None], None], batch_id: str | None
    ) -> threading.Thread:
        def guarded() -> None:
            try:
                loop(batch_id)
            except BaseException as exc:  # surfaced by run(); the other threads stop too
                log.exception("%s stopped on an error", name)
                self._errors.append(exc)
                self.stop()

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        thread.start()
        return thread

    def _interrupt(self, batch_id: str, threads: list[threading.Thread]) -> RunResult:
        """Stop claiming, put in-flight jobs back, leave finished ones as they are."""
        self.stop()
        with self._claiming, self.sessions.begin() as session:
            released = store.release_running(session, batch_id)
        for thread in threads:
            thread.join(timeout=0.1)
        return RunResult(self.counts(batch_id), interrupted=True, released=released)

    def _fast_loop(self, batch_id: str | None) -> None:
        try:
            while not self._stop.is_set():
                tickets = self._claim(QUEUED, self.settings.fast_batch_size, batch_id)
                if not tickets and self._serving:
                    self._wake.wait(timeout=1.0)  # until notify(), or look again anyway
                    self._wake.clear()
                    continue
                if not tickets:
                    return
                outcomes = self._fast_batch(tickets)
                with self.sessions.begin() as session:
                    store.record_fast(session, outcomes, self.funnel.gate)
                if any(isinstance(outcome, Deferred) for outcome in outcomes):
                    with self._deferred_ready:
                        self._deferred_ready.notify_all()
        finally:
            self._fast_done.set()
            with self._deferred_ready:
                self._deferred_ready.notify_all()

    def _claim(self, status: str, limit: int, batch_id: str | None) -> list[Ticket]:
        """Claim up to ``limit`` waiting jobs; none once stopped."""
        with self._claiming:
            if self._stop.is_set():
                return []
            with self.sessions.begin() as session:
                return store.claim(session, status, limit, batch_id)

    def _fast_batch(self, tickets: list[Ticket]) -> list[FastOutcome]:
        loaded = [ticket.load(self.settings.image_limits) for ticket in tickets]
        queries = [query for query in loaded if isinstance(query, Query)]
        failed: list[FastOutcome] = [query for query in loaded if isinstance(query, Failed)]
        result = run_fast_stage(
            queries, large=self.models.large, small=self.models.small, settings=self.funnel
        )
        return failed + result.outcomes

    def _agent_loop(self, batch_id: str | None) -> None:
        while not self._stop.is_set():
            tickets = self._claim(DEFERRED, 1, batch_id)
            if tickets:
                self._agent_job(tickets[0])
                continue
            if self._fast_done.is_set() and batch_id is not None:
                with self.sessions.begin() as session:  # one last look: fast may just have ended
                    if not store.count_status(session, DEFERRED, batch_id):
                        return
                continue
            with self._deferred_ready:
                self._deferred_ready.wait(timeout=1.0)

    def _agent_job(self, ticket: Ticket) -> None:
        query = ticket.load(self.settings.image_limits)
        outcome = (
            query
            if isinstance(query, Failed)
            else run_agent_stage(query, self.models.large, self.limits)
        )
        with self.sessions.begin() as session:
            store.record_agent(session, outcome)
