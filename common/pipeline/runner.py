"""The embedded runner: the whole funnel in one process, over the job store.

It is the in-process ``Dispatcher``: two kinds of thread work the store side by side,
and sending a job only wakes them.

- the **fast stage** (one thread) claims queued jobs in micro-batches and hands them to
  ``FastWork``: accepted answers are final the moment their batch is recorded, deferred
  jobs wake the agent threads;
- the **agent stage** (``agent_workers`` threads) claims deferred jobs one at a time and
  hands each to ``AgentWork``, so a slow trajectory never holds up the fast stage.

The database is the queue: a job is claimed by moving it to ``running`` and finished by a
conditional write, so a restarted run (after Ctrl-C or a crash) releases ``running`` jobs
back to ``queued`` / ``deferred`` and nothing is lost or recorded twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import cached_property

from sqlalchemy.orm import Session, sessionmaker

from common.backends import Models
from common.config import Settings
from common.contracts import JobStatus, Queue, Stage, Ticket
from common.errors import BackendUnavailable
from common.pipeline.dispatch import Delivery, Dispatcher
from common.pipeline.follow import NO_WATCH, Progress, RunResult, Watch
from common.pipeline.work import AgentWork, FastWork
from common.store import audits, claims, reads
from common.store.reads import BatchCounts

log = logging.getLogger(__name__)

# How long an interrupted run waits for its stage threads to end their current step (a
# generation ends at its next token; a sandboxed execution within its own time limit).
DRAIN_S = 30.0


class EmbeddedRunner(Dispatcher):
    """Runs the funnel with a fast thread and agent threads: one batch (``run``) or every
    job of the store as it arrives (``start``, a server without a broker).

    ``models`` may be a callable that loads them: they are loaded on first use, so a run
    with nothing left to do loads none.
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        models: Models | Callable[[], Models],
        settings: Settings,
    ) -> None:
        self.sessions = sessions
        self._models = models
        self.settings = settings
        self._stop = threading.Event()
        self._wake = threading.Event()  # new work was submitted (serving)
        self._serving = False
        self._fast_done = threading.Event()
        self._deferred_ready = threading.Condition()
        self._hold_until = {Stage.FAST: 0.0, Stage.AGENT: 0.0}  # retries wait (monotonic s)
        self._errors: list[BaseException] = []
        # Held while claiming and while an interrupt puts running jobs back, so no claim
        # can slip in after the release (it would leave a job ``running`` on exit).
        self._claiming = threading.Lock()
        self._threads: list[threading.Thread] = []  # every stage thread started
        self._running: set[str] = set()  # the stage threads whose loop has not returned
        # notified as each loop returns: what an interrupt waits on (a Thread.join cut
        # short by Ctrl-C marks a thread that still runs as ended, and returns at once)
        self._ended = threading.Condition()
        self._drained = False  # the threads were ended (and waited for) once already

    @cached_property
    def models(self) -> Models:
        return self._models if isinstance(self._models, Models) else self._models()

    @cached_property
    def fast(self) -> FastWork:
        return FastWork(self.sessions, self.models, self.settings, self, split_first=True)

    @cached_property
    def agent(self) -> AgentWork:
        return AgentWork(self.sessions, self.models, self.settings, self)

    # -- the Dispatcher ---------------------------------------------------------------
    def deliver(self, queue: Queue, job_ids: list[str], how: Delivery) -> int:
        """The jobs are in the store already: wake the stage that takes them (after
        ``delay_s``); audits wake the agents, who take them last."""
        if queue == Queue.FAST:
            self._hold(Stage.FAST, how.delay_s)
            self._wake.set()
            return len(job_ids)
        if queue == Queue.SLOW:
            self._hold(Stage.AGENT, how.delay_s)
        with self._deferred_ready:
            self._deferred_ready.notify_all()
        return len(job_ids)

    def wait(
        self, sessions: sessionmaker[Session], batch_id: str, watch: Watch = NO_WATCH
    ) -> RunResult:
        """Work the batch here until it is finished (this runner's own store)."""
        counts = self.counts(batch_id)
        if counts.finished == counts.jobs:
            return RunResult(counts)
        return self.run(batch_id, on_progress=watch.on_progress)

    component = "runner"

    def start(self) -> None:
        self.serve()

    def check(self) -> None:
        """Raise ``BackendUnavailable`` if a stage thread stopped on an error."""
        if self._errors:
            raise BackendUnavailable(f"a stage stopped on an error: {self._errors[0]!r}")

    def close(self) -> None:
        """Stop, and wait for the stage threads to end (a server shutting down)."""
        self._end_threads()

    # -- running ----------------------------------------------------------------------
    def run(
        self, batch_id: str, *, on_progress: Progress | None = None, poll_s: float = 0.5
    ) -> RunResult:
        """Work the batch until every job is done or failed, or until interrupted."""
        started = time.perf_counter()
        with self.sessions.begin() as session:
            released = claims.release_running(session, batch_id)
            audits.release(session)
            finished_before = reads.batch_counts(session, batch_id).finished
        if released:
            log.info("released %d jobs left running by an earlier run", released)
        try:  # (an interrupt may come while the threads start: they are put away too)
            for thread in self._start_threads(batch_id):
                while thread.is_alive():  # the run ends the moment its last thread does
                    if on_progress is not None:
                        on_progress(self.counts(batch_id))
                    thread.join(poll_s)
        except KeyboardInterrupt:
            result = self._interrupt(batch_id)
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
        """Work every job of the store, as it arrives, until ``stop()``. Returns the
        started threads."""
        with self.sessions.begin() as session:
            released = claims.release_running(session)
            audits.release(session)
        if released:
            log.info("released %d jobs left running by an earlier run", released)
        self._serving = True
        return self._start_threads(None)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        with self._deferred_ready:
            self._deferred_ready.notify_all()

    def counts(self, batch_id: str) -> BatchCounts:
        with self.sessions() as session:
            return reads.batch_counts(session, batch_id)

    # -- internals ------------------------------------------------------------------
    def _start_threads(self, batch_id: str | None) -> list[threading.Thread]:
        self.models  # noqa: B018 -- load before the threads start, not in each of them
        self._thread("fast-stage", self._fast_loop, batch_id)
        for i in range(self.settings.agent.workers):
            self._thread(f"agent-{i}", self._agent_loop, batch_id)
        return list(self._threads)

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
            finally:
                with self._ended:
                    self._running.discard(name)
                    self._ended.notify_all()

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        self._running.add(name)  # (before it starts: an interrupt may come in between)
        self._threads.append(thread)
        thread.start()
        return thread

    def _interrupt(self, batch_id: str) -> RunResult:
        """Stop claiming, end the stage threads (``_end_threads``), then put back what is
        still claimed; finished jobs stay as they are. An interrupt is not the jobs'
        doing: their attempts are given back."""
        try:
            self._end_threads()
        except KeyboardInterrupt:
            log.warning("a second interrupt: not waiting for the stage threads")
        with self._claiming, self.sessions.begin() as session:
            released = claims.release_running(session, batch_id, count_attempt=False)
        return RunResult(self.counts(batch_id), interrupted=True, released=released)

    def lingering(self) -> list[str]:
        """The stage threads still running (after an interrupt: those that outran the
        wait). Counted by their loops, not ``is_alive()``: a join cut short by Ctrl-C
        marks a thread that still runs as stopped."""
        return sorted(self._running)

    def _end_threads(self) -> None:
        """Stop claiming, end the generations in progress at their next token, and wait
        (up to ``DRAIN_S``) for the stage threads to put their jobs back and return.

        The threads must end before the process does: one left inside torch when Python
        exits aborts it (``terminate called without an active exception``)."""
        self.stop()
        if "models" in vars(self):  # loaded (a cached_property)
            self.models.stop.set()
        if self._drained:  # (close() after an interrupt: waited already, or told not to)
            return
        started = time.monotonic()
        mine = {thread.name for thread in self._threads if thread is threading.current_thread()}
        try:
            with self._ended:
                self._ended.wait_for(lambda: not self._running - mine, timeout=DRAIN_S)
        finally:
            self._drained = True
        if lingering := sorted(set(self.lingering()) - mine):
            waited = time.monotonic() - started
            log.warning("still running after %.0f s: %s", waited, ", ".join(lingering))

    def _hold(self, stage: Stage, delay_s: float | None) -> None:
        if delay_s:
            self._hold_until[stage] = max(self._hold_until[stage], time.monotonic() + delay_s)

    def _claim(self, stage: Stage, limit: int, batch_id: str | None) -> list[Ticket]:
        """Claim up to ``limit`` waiting jobs; none once stopped. Retries sent back with a
        delay hold the stage's claims until it has passed."""
        self._stop.wait(max(0.0, self._hold_until[stage] - time.monotonic()))
        return self._claimed(lambda session: claims.claim(session, stage, limit, batch_id))

    def _claim_audit(self, batch_id: str | None) -> list[Ticket]:
        return self._claimed(lambda session: audits.claim(session, batch_id=batch_id))

    def _claimed(self, claim: Callable[[Session], list[Ticket]]) -> list[Ticket]:
        """``claim`` in a transaction of its own; nothing once stopped (an interrupt puts
        back what is claimed, under the same lock)."""
        with self._claiming:
            if self._stop.is_set():
                return []
            with self.sessions.begin() as session:
                return claim(session)

    def _fast_loop(self, batch_id: str | None) -> None:
        try:
            while not self._stop.is_set():
                tickets = self._claim(Stage.FAST, self.settings.funnel.fast_batch_size, batch_id)
                if not tickets and self._serving:
                    self._wake.wait(timeout=1.0)  # until notify(), or look again anyway
                    self._wake.clear()
                    continue
                if not tickets:
                    return
                self.fast.run(tickets)
        finally:
            self._fast_done.set()
            with self._deferred_ready:
                self._deferred_ready.notify_all()

    def _agent_loop(self, batch_id: str | None) -> None:
        while not self._stop.is_set():
            tickets = self._claim(Stage.AGENT, 1, batch_id)
            if tickets:
                self.agent.run(tickets[0])
                continue
            audit = self._claim_audit(batch_id)  # only when no deferred job waits
            if audit:
                self.agent.run_audit(audit[0])
                continue
            if self._fast_done.is_set() and batch_id is not None:
                with self.sessions.begin() as session:  # one last look: fast may just have ended
                    if not reads.count_status(session, JobStatus.DEFERRED, batch_id) and not (
                        audits.unfinished(session, batch_id)
                    ):
                        return
                continue
            with self._deferred_ready:
                self._deferred_ready.wait(timeout=1.0)
