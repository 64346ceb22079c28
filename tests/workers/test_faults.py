"""Faults with real workers, on a Redis and a PostgreSQL of the test's own: every job ends
final, none twice, answers written before the fault unchanged, no command run by hand
(a supervisor restarts exited workers, as compose's restart policy does)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from common.contracts import JobStatus, Queue, Stage
from tests.helpers.api import Api, upload
from tests.helpers.faults import RECOVERY, OwnPostgres, OwnRedis, Run
from tests.helpers.images import png
from tests.helpers.services import REDIS_URL
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.faults


def test_a_redis_restart_without_persistence_strands_no_job(tmp_path: Path, postgres_url: str):
    redis = OwnRedis(tmp_path)
    redis.start()
    run = Run(tmp_path, redis.url, postgres_url, tool_free=0.6, confident=0.6, agent_step_s=0.3)
    try:
        run.supervised("fast", "slow", "slow")
        batch_id = run.submit(60)

        def mid_run() -> bool:
            jobs = run.jobs()
            done = sum(job.status == JobStatus.DONE for job in jobs)
            agent = sum(job.stage == Stage.AGENT and job.status != JobStatus.DONE for job in jobs)
            return done >= 10 and agent >= 2

        wait_until(mid_run, deadline_s=60, what="the run to be under way")
        before = run.answers()
        redis.restart()  # every message, queued or held, is gone
        took = run.finish(batch_id, bound_s=60, before=before)
        print(
            f"Redis restart: all final {took:.1f} s after it ({run.workers.restarts} "
            "worker restart(s) by the supervisor)"
        )
    finally:
        run.close()
        redis.stop()


def test_a_postgresql_restart_loses_nothing(tmp_path: Path, redis_client):
    postgres = OwnPostgres()
    postgres.init()
    postgres.start()
    run = Run(tmp_path, REDIS_URL, postgres.url, tool_free=0.6, confident=0.6, agent_step_s=0.3)
    try:
        run.supervised("fast", "slow", "slow")
        batch_id = run.submit(60)
        wait_until(lambda: len(run.answers()) >= 10, deadline_s=60, what="the run under way")
        before = run.answers()
        postgres.stop()  # an immediate stop: connections drop mid-transaction
        time.sleep(3)  # an outage of a few seconds, then the server is back
        postgres.start()
        took = run.finish(batch_id, bound_s=60, before=before)
        print(f"PostgreSQL restart: all final {took:.1f} s after it came back")
    finally:
        run.close()
        prefix = run.env["SPECEYES_BROKER_KEY_PREFIX"]
        keys = list(redis_client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            redis_client.delete(*keys)
        postgres.close()


def test_a_killed_slow_worker_is_taken_over_by_heartbeat(tmp_path: Path, postgres_url: str):
    visibility_timeout_s = int(RECOVERY["SPECEYES_VISIBILITY_TIMEOUT_S"])
    redis = OwnRedis(tmp_path)
    redis.start()
    run = Run(tmp_path, redis.url, postgres_url, tool_free=0.0, agent_step_s=2.0)
    try:
        run.workers.start("fast")
        victim = run.workers.start("slow")
        run.workers.start("slow")
        batch_id = run.submit(4)  # every job to the agent, 2 s each

        def held_by_victim() -> str | None:
            for job in run.jobs():
                if job.status == JobStatus.RUNNING and f":{victim.process.pid}:" in (
                    job.worker or ""
                ):
                    return job.id
            return None

        job_id = wait_until(held_by_victim, deadline_s=60, what="a trajectory on the victim")
        victim.kill()
        killed_at = time.monotonic()
        wait_until(
            lambda: any(j.id == job_id and j.status == JobStatus.DONE for j in run.jobs()),
            deadline_s=40,
            what="the killed worker's job to be taken over",
        )
        took = time.monotonic() - killed_at
        print(
            f"SIGKILL mid-trajectory: its job done {took:.1f} s later "
            f"(visibility timeout {visibility_timeout_s} s)"
        )
        # heartbeat (5 s) + a sweep (1 s) + a 2 s trajectory behind another, plus slack
        assert took < 30 < visibility_timeout_s
        run.finish(batch_id, bound_s=60, before={})
    finally:
        run.close()
        redis.stop()


def test_the_api_answers_202_with_the_broker_down_and_the_job_is_sent_later(
    tmp_path: Path, postgres_url: str
):
    """Before: the job was committed, the enqueue failed, the answer was a plain-text 500,
    and a retry answered ``created: false`` without ever sending it."""
    redis = OwnRedis(tmp_path)
    redis.start()
    server = Api(
        tmp_path / "api",
        postgres_url,
        broker_url=redis.url,
        broker_key_prefix="api-faults:",
        reconcile_after_s=0.5,
    )
    try:
        redis.stop()
        first = upload(server, png(), idempotency_key="k")
        assert first.status_code == 202 and first.json()["created"] is True, first.text
        again = upload(server, png(), idempotency_key="k")
        assert again.status_code == 202 and again.json()["created"] is False
        job_id = first.json()["id"]
        redis.start()  # back, empty: the job is still in no queue
        again = upload(server, png(), idempotency_key="k")  # a retry sends it now
        assert job_id in server.dispatcher.message_ids()
        redis.restart()  # lost again; this time nobody retries: the reconciler sends it
        from common.reconcile import Reconciler

        clock = [0.0]
        reconciler = Reconciler(
            server.sessions, server.dispatcher, server.settings, "t", clock=lambda: clock[0]
        )
        reconciler.sweep()  # seen missing
        clock[0] += 1  # (longer than reconcile_after_s)
        assert reconciler.sweep().resent == {Queue.FAST: 1}
        assert job_id in server.dispatcher.message_ids()
    finally:
        server.close()
        redis.stop()
