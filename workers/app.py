"""The workers' Celery app: the fast (batched) and slow tasks, thin over ``common.pipeline.work``.

- ``speceyes.fast`` is a celery-batches task: messages (each a micro-batch of job ids,
  as ``CeleryDispatcher.send_fast`` packs them, or one id) are buffered until
  ``fast_batch_size`` of them arrived or ``fast_max_wait_s`` passed; their ids then go to
  ``FastWork.run_ids`` in micro-batches of ``fast_batch_size``. A bulk submission's full
  messages run at once; ids trickling in one by one (the API) are gathered as before.
  Deferred jobs are sent to the slow queue after their batch is committed (by the work
  unit, through the dispatcher).
- ``speceyes.slow`` runs a message's jobs (one id, or up to ``SLOW_PACK`` packed:
  ``workers.queues``) one trajectory after another, each claimed when it starts
  (``AgentWork.run_id``). Whenever the slow queue is empty (another slow worker may be
  idle), the jobs not started are sent back one a message; a worker told to stop sends
  them back too.

Both acknowledge late, and the conditional writes make a second delivery harmless. A
worker that dies mid-batch is found by its stopped heartbeat and its jobs are handed to
others by the reconciler (``workers.supervision``), or its messages come back after the
visibility timeout, whichever is first. When the store fails outside any one job (an
outage), the job ids are sent again after a delay that doubles with each retry (with
jitter, capped), and the error is logged once with a count. Models load once per worker
process, after it starts (``worker_ready``), never before.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from celery import bootsteps
from celery.signals import task_postrun, task_prerun, worker_ready, worker_shutdown
from celery.worker import state as worker_state
from celery_batches import Batches, SimpleRequest

from common.backends import Models, load_models
from common.backends.inference_client import Backoff
from common.config import Settings
from common.contracts import Queue
from common.errors import BackendUnavailable
from common.pipeline.gate import warm_up
from common.pipeline.work import AgentWork, FastWork
from common.store.db import open_store
from workers import metrics
from workers.queues import (
    AUDIT_TASK,
    FAST_TASK,
    SLOW_TASK,
    CeleryDispatcher,
    celery_app,
    chunked,
    payload_ids,
)
from workers.supervision import Repeated, Supervisor, serve_health

log = logging.getLogger(__name__)
SLOW_BUSY_RECHECK_S = 0.1  # (so an idle slow worker waits at most a trajectory and this)


class TimedBatches(Batches):
    """celery-batches with its timed flush re-armed whenever the consumer (re)starts.

    celery-batches arms the flush timer on the first message and remembers that it did;
    a consumer restarted after a lost broker connection has a new timer, so the old
    reference kept the flush from being armed again, and a part batch then waited for a
    full one (or the visibility timeout). Forgetting the reference here re-arms it.
    """

    abstract = True

    def Strategy(self, task: Any, app: Any, consumer: Any) -> Any:
        self._tref = None
        return super().Strategy(task, app, consumer)


def _ids(request: SimpleRequest) -> list[str]:
    """The job ids a fast message carries: a micro-batch's list, or one id."""
    return payload_ids(request.args[0])


def backoff_s(settings: Settings, retries: int) -> float:
    """The wait before the ``retries``-th send after an outage: the service's one backoff
    (``common.backends.inference_client.Backoff``: doubling, capped, jittered)."""
    recovery = settings.recovery
    policy = Backoff(first_s=recovery.retry_delay_s, max_s=recovery.retry_max_delay_s)
    return policy.delay_s(retries + 1)


@dataclass
class Runtime:
    """What the tasks of one worker process share; built on first use, after the start."""

    settings: Settings
    app: Any
    pool: str = "fast"

    @cached_property
    def sessions(self) -> Any:
        return open_store(self.settings.database_url)

    @cached_property
    def supervisor(self) -> Supervisor:
        return Supervisor(self.pool, self.settings, self.sessions, self.dispatcher)

    @cached_property
    def models(self) -> Models:
        log.info(
            "loading models: small %s, large %s",
            self.settings.models.small.name,
            self.settings.models.large.name,
        )
        return load_models(self.settings)

    @cached_property
    def dispatcher(self) -> CeleryDispatcher:
        return CeleryDispatcher(self.settings, self.app)

    @cached_property
    def fast(self) -> FastWork:
        worker = self.supervisor.worker
        return FastWork(
            self.sessions, self.models, self.settings, self.dispatcher, worker, split_first=True
        )

    @cached_property
    def slow(self) -> AgentWork:
        return AgentWork(
            self.sessions, self.models, self.settings, self.dispatcher, self.supervisor.worker
        )


def make_app(settings: Settings, *, metrics_port: int | None = None, pool: str = "fast") -> Any:
    """The Celery app with both tasks registered, for ``settings``, in a ``pool`` worker."""
    app = celery_app(settings)
    runtime = Runtime(settings, app, pool)
    lock = threading.Lock()  # one batch at a time, whichever flush (timer or full buffer) runs it
    repeated = Repeated(log)

    @app.task(
        name=FAST_TASK,
        base=TimedBatches,
        flush_every=settings.funnel.fast_batch_size,
        flush_interval=settings.funnel.fast_max_wait_s,
        acks_late=True,
    )
    def fast(requests: list[SimpleRequest]) -> None:
        job_ids = list(dict.fromkeys(i for request in requests for i in _ids(request)))
        takeover = {i for r in requests if (r.kwargs or {}).get("takeover") for i in _ids(r)}
        retries = max((int((r.kwargs or {}).get("retries", 0)) for r in requests), default=0)
        size = settings.funnel.fast_batch_size
        fresh = [i for i in job_ids if i not in takeover]
        held = sorted(takeover)
        chunks = [(chunk, False) for chunk in chunked(fresh, size)]
        chunks += [(chunk, True) for chunk in chunked(held, size)]
        number = 0  # the micro-batch running
        try:
            with lock:
                for number, (chunk, taken_over) in enumerate(chunks):
                    if worker_state.should_stop is not None:  # a warm shutdown (SIGTERM)
                        _hand_back(chunks[number:])
                        break
                    report = runtime.fast.run_ids(chunk, takeover=taken_over)
                    metrics.record_fast(len(chunk), report)  # (per micro-batch, as run)
        except Exception:
            # The store failed outside any one job's work (the database went away). The
            # messages are acknowledged anyway (celery-batches), so send the ids of this
            # micro-batch and the ones after it again (those before are recorded),
            # marked: some may be claimed by this worker and stuck as running.
            repeated.error("fast", "a fast batch failed outside its jobs; sending it again")
            delay = backoff_s(settings, retries)
            unfinished = [i for chunk, _ in chunks[number:] for i in chunk]
            runtime.dispatcher.send_again(
                runtime.sessions,
                Queue.FAST,
                unfinished,
                delay_s=delay,
                takeover=True,
                retries=retries + 1,
            )
            return
        repeated.cleared("fast", "fast batches are recorded again")

    def _hand_back(chunks: list[tuple[list[str], bool]]) -> None:
        """The micro-batches of a flush not started when the worker was told to stop: sent
        again (they were not claimed) before the flush's messages are acknowledged, so a
        stopping worker finishes the batch it runs, not all 32 of a flush."""
        for chunk, taken_over in chunks:
            runtime.dispatcher.send_again(runtime.sessions, Queue.FAST, chunk, takeover=taken_over)
        log.info("stopping: %d micro-batches handed back to the queue", len(chunks))

    @app.task(name=SLOW_TASK, acks_late=True)
    def slow(payload: str | list[str], takeover: bool = False, retries: int = 0) -> None:
        pending = payload_ids(payload)
        started = False
        while pending:
            if started and worker_state.should_stop is not None:  # a warm shutdown (SIGTERM)
                runtime.dispatcher.send_again(
                    runtime.sessions, Queue.SLOW, pending, takeover=takeover
                )
                log.info("stopping: %d deferred jobs handed back", len(pending))
                return
            job_id, rest = pending[0], pending[1:]
            if rest and _slow_queue_empty():
                # a slow worker may be idle: the jobs not started go to whoever is free
                runtime.dispatcher.send_again(
                    runtime.sessions, Queue.SLOW, rest, takeover=takeover, one_each=True
                )
                rest = []
            started = True
            try:
                report = runtime.slow.run_id(job_id, takeover=takeover)
            except Exception:
                # as for a fast batch: this job (marked: it may be held here) and those
                # after it are sent again
                repeated.error("slow", "the agent stage failed outside a job; sending it again")
                delay = backoff_s(settings, retries)
                runtime.dispatcher.send_again(
                    runtime.sessions,
                    Queue.SLOW,
                    [job_id],
                    delay_s=delay,
                    takeover=True,
                    retries=retries + 1,
                )
                if rest:  # (never claimed here: no takeover for them)
                    runtime.dispatcher.send_again(
                        runtime.sessions, Queue.SLOW, rest, delay_s=delay, retries=retries + 1
                    )
                return
            repeated.cleared("slow", "agent results are recorded again")
            metrics.record_agent(report)
            pending = rest

    busy_until = [0.0]  # the slow queue was seen holding messages: not asked again till then

    def _slow_queue_empty() -> bool:
        """Whether no message waits on the slow queue (False when Redis does not say). A
        queue seen busy is taken to stay so for ``SLOW_BUSY_RECHECK_S`` (jobs that take
        no time would otherwise ask Redis once each)."""
        if time.monotonic() < busy_until[0]:
            return False
        try:
            empty = not runtime.dispatcher.queue_depth(settings.broker.slow_queue)
        except BackendUnavailable:
            return False
        if not empty:
            busy_until[0] = time.monotonic() + SLOW_BUSY_RECHECK_S
        return empty

    @app.task(name=AUDIT_TASK, acks_late=True)
    def audit(job_id: str) -> None:
        try:
            report = runtime.slow.run_audit_id(job_id)
        except Exception:
            repeated.error("audit", "an audit failed outside its job; sending it again")
            delay = backoff_s(settings, 1)
            runtime.dispatcher.send_audit([job_id], delay_s=delay, sessions=runtime.sessions)
            return
        metrics.record_audit(report)

    class ConsumerWatch(bootsteps.StartStopStep):
        """Tells the supervisor each time the consumer (re)starts: after a lost broker
        connection the consumer's steps start again, a stuck consumer's never do."""

        requires = ("celery.worker.consumer.tasks:Tasks",)

        def start(self, parent: Any) -> None:
            runtime.supervisor.consumer_connected()

    app.steps["consumer"].add(ConsumerWatch)

    @worker_ready.connect(weak=False)
    def start(**_: Any) -> None:
        runtime.models  # noqa: B018 -- load now, not on the first message
        warm_up(settings.funnel.gate)
        runtime.supervisor.start()
        if metrics_port:
            serve_health(metrics_port, runtime.supervisor, metrics.wsgi_app(runtime.dispatcher))
            log.info("metrics and health on :%d (/metrics, /healthz, /readyz)", metrics_port)

    @task_prerun.connect(weak=False)
    def began(**_: Any) -> None:
        runtime.supervisor.task_started()

    @task_postrun.connect(weak=False)
    def ended(**_: Any) -> None:
        runtime.supervisor.task_finished()

    @worker_shutdown.connect(weak=False)
    def leave(**_: Any) -> None:
        if "supervisor" in runtime.__dict__:
            runtime.supervisor.stop()

    app.speceyes_runtime = runtime
    return app
