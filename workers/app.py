"""The workers' Celery app: the fast (batched) and slow tasks, thin over ``common.work``.

- ``speceyes.fast`` is a celery-batches task: messages (one job id each) are buffered
  until ``fast_batch_size`` of them arrived or ``fast_max_wait_s`` passed, then the ids go
  to ``FastWork.run_ids`` as one batch. Deferred jobs are sent to the slow queue after
  their batch is committed (by the work unit, through the dispatcher).
- ``speceyes.slow`` runs one trajectory per message (``AgentWork.run_id``).

Both acknowledge late: a worker that dies mid-batch leaves its messages to come back after
the visibility timeout, and the conditional writes make the second delivery harmless.
Models load once per worker process, after it starts (``worker_ready``), never before.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from celery.signals import worker_ready
from celery_batches import Batches, SimpleRequest

from common.backends import Models, load_models
from common.config import Settings
from common.gate import warm_up
from common.store.db import open_store
from common.work import AgentWork, FastWork
from workers import metrics
from workers.dispatch import FAST_TASK, SLOW_TASK, CeleryDispatcher, celery_app

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    """What the tasks of one worker process share; built on first use, after the start."""

    settings: Settings
    app: Any

    @cached_property
    def models(self) -> Models:
        log.info("loading models: small %s, large %s", self.settings.small_model,
                 self.settings.large_model)  # fmt: skip
        return load_models(self.settings)

    @cached_property
    def dispatcher(self) -> CeleryDispatcher:
        return CeleryDispatcher(self.settings, self.app)

    @cached_property
    def fast(self) -> FastWork:
        sessions = open_store(self.settings.database_url)
        return FastWork(sessions, self.models, self.settings, self.dispatcher, split_first=True)

    @cached_property
    def slow(self) -> AgentWork:
        sessions = open_store(self.settings.database_url)
        return AgentWork(sessions, self.models, self.settings, self.dispatcher)


def make_app(settings: Settings, *, metrics_port: int | None = None) -> Any:
    """The Celery app with both tasks registered, for ``settings``."""
    app = celery_app(settings)
    runtime = Runtime(settings, app)
    lock = threading.Lock()  # one batch at a time, whichever flush (timer or full buffer) runs it

    @app.task(
        name=FAST_TASK,
        base=Batches,
        flush_every=settings.fast_batch_size,
        flush_interval=settings.fast_max_wait_s,
        acks_late=True,
    )
    def fast(requests: list[SimpleRequest]) -> None:
        job_ids = list(dict.fromkeys(str(request.args[0]) for request in requests))
        takeover = {str(r.args[0]) for r in requests if (r.kwargs or {}).get("takeover")}
        try:
            with lock:
                delivery = runtime.fast.run_ids([i for i in job_ids if i not in takeover])
                if takeover:
                    delivery.merge(runtime.fast.run_ids(sorted(takeover), takeover=True))
        except Exception:
            # The store failed outside any one job's work (the database went away). The
            # messages are acknowledged anyway (celery-batches), so send the ids again,
            # marked: some of them may be claimed by this worker and stuck as running.
            log.exception("fast batch of %d failed; sending it again", len(job_ids))
            runtime.dispatcher.send_fast(job_ids, delay_s=settings.retry_delay_s, takeover=True)
            return
        metrics.record_fast(len(job_ids), delivery)

    @app.task(name=SLOW_TASK, acks_late=True)
    def slow(job_id: str, takeover: bool = False) -> None:
        try:
            delivery = runtime.slow.run_id(job_id, takeover=takeover)
        except Exception:
            log.exception("job %s: the agent stage failed outside the job; sending it again",
                          job_id)  # fmt: skip
            runtime.dispatcher.send_slow([job_id], delay_s=settings.retry_delay_s, takeover=True)
            return
        metrics.record_agent(delivery)

    @worker_ready.connect(weak=False)
    def start(**_: Any) -> None:
        runtime.models  # noqa: B018 -- load now, not on the first message
        warm_up(settings.gate)
        if metrics_port:
            metrics.serve(metrics_port, runtime.dispatcher)
            log.info("metrics on :%d/metrics", metrics_port)

    app.speceyes_runtime = runtime
    return app
