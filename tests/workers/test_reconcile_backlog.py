"""The reconciler over a real backlog: PostgreSQL holding 100,000 jobs, half of them
queued with their messages on Redis (a scratch key prefix), as ``speceyes bench scale``
grows it to a million (the figures at a million: docs/benchmarks.md).

One sweep reads the oldest message of each list and the held ones, never the backlog:
a job whose message was lost two minutes before the queue's oldest is sent again by the
very next sweep, and none of the 50,000 whose messages wait is sent twice."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import DateTime, bindparam, text

from common.config import Settings
from common.contracts import Queue
from common.pipeline.reconcile import Reconciler
from common.store.db import open_store
from lab.bench.scale import grow, new_batch
from tests.helpers.services import REDIS_URL
from workers.queues import CeleryDispatcher

JOBS = 100_000


def test_a_job_stranded_behind_a_backlog_is_sent_again_by_the_next_sweep_alone(
    postgres_url, redis_client
):
    tag = uuid.uuid4().hex[:10]
    settings = Settings(
        database_url=postgres_url,
        broker_url=REDIS_URL,
        broker_key_prefix=f"speceyes-test-{tag}:",
        fast_queue=f"fast-{tag}",
        slow_queue=f"slow-{tag}",
    )
    sessions = open_store(postgres_url)
    dispatcher = CeleryDispatcher(settings)
    try:
        grow(sessions, dispatcher, new_batch(sessions, None), None, 0, JOBS)
        queued = JOBS // 2
        assert dispatcher.queue_depth(settings.broker.fast_queue) == queued // 32 + 1
        reconciler = Reconciler(sessions, dispatcher, settings, "backlog")
        assert reconciler.sweep().resent == {}  # every queued job's message is there
        lost = uuid.uuid4().hex
        gone = datetime.now(UTC) - timedelta(minutes=2)
        with sessions.begin() as session:
            session.execute(
                text(
                    "INSERT INTO jobs (id, idempotency_key, question, status, stage, "
                    "priority, attempts, announces, created_at, sent_at) VALUES (:id, :id, "
                    "'lost', 'queued', 'fast', 1, 0, false, :gone, :gone)"
                ).bindparams(bindparam("gone", type_=DateTime(timezone=True))),
                {"id": lost, "gone": gone},
            )
        assert reconciler.sweep().resent == {Queue.FAST: 1}
        assert lost in dispatcher.message_ids(held=False)  # (read whole: a test may)
        assert reconciler.sweep().resent == {}  # its new message is on the queue now
    finally:
        dispatcher.delete_keys()
        dispatcher.close()
        sessions.close()
