"""Faults with real workers, on a Redis and a PostgreSQL of the test's own: every job ends
final, none twice, answers written before the fault unchanged, no command run by hand
(a supervisor restarts exited workers, as compose's restart policy does)."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from common.contracts import JobStatus, Queue, Stage
from tests.helpers.api import Api, upload
from tests.helpers.faults import RECOVERY, OwnPostgres, OwnRedis, Run
from tests.helpers.images import png
from tests.helpers.services import REDIS_URL
from tests.helpers.waiting import wait_until
from tests.workers.soak import FAULTS, soak

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


def test_a_redis_restart_at_the_default_settings_heals_within_a_minute(
    tmp_path: Path, postgres_url: str
):
    """As an operator runs it: every recovery setting at its default (heartbeat 5 s,
    sweeps every 10 s, stall exit 120 s, visibility timeout 1 h), 1 fast and 2 slow
    workers under a restart loop, Redis killed without persistence a quarter of the way.
    Every job is final within 60 s of Redis's return: the workers read its new run id,
    the reconciler sends the waiting jobs at once, and a worker whose consumer stayed
    stuck leaves for its supervisor (before: 141 s, waiting for the stall watchdog)."""
    redis = OwnRedis(tmp_path)
    redis.start()
    run = Run(
        tmp_path,
        redis.url,
        postgres_url,
        recovery={},
        tool_free=0.5,
        confident=0.7,
        agent_step_s=0.05,
    )
    try:
        run.supervised("fast", "slow", "slow")
        batch_id = run.submit(300)
        total = len(run.jobs())
        wait_until(lambda: len(run.answers()) >= total // 4, deadline_s=120, what="a quarter final")
        before = run.answers()
        redis.restart()  # every message, queued or held, is gone
        took = run.finish(batch_id, bound_s=60, before=before)
        print(
            f"Redis restart at the defaults: all final {took:.1f} s after it "
            f"({run.workers.restarts} worker restart(s))"
        )
        assert took < 60
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
        from common.pipeline.reconcile import Reconciler

        clock = [time.time()]
        reconciler = Reconciler(
            server.sessions, server.dispatcher, server.settings, "t", clock=lambda: clock[0]
        )
        reconciler.sweep()  # (its queue is empty: gone once reconcile_after_s has passed)
        clock[0] += 1  # (longer than reconcile_after_s)
        assert reconciler.sweep().resent == {Queue.FAST: 1}
        assert job_id in server.dispatcher.message_ids()
    finally:
        server.close()
        redis.stop()


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_a_soak_with_every_kind_of_fault_loses_and_changes_nothing():
    """Five minutes of steady load at the default recovery settings, each kind of fault
    once in a random order (SIGKILL of the fast and of a slow worker, SIGTERM of one, a
    Redis restart, a PostgreSQL restart, a 20 s pause of Redis): nothing lost or
    rewritten, every fault healed within a minute of the service's return, no worker's
    memory growing, no log storm. The 30-minute run: docs/operations.md."""
    seconds = float(os.environ.get("SPECEYES_SOAK_S", "300"))
    seed = int(os.environ.get("SPECEYES_SOAK_SEED", str(int(time.time()))))
    kinds = random.Random(seed).sample(FAULTS, len(FAULTS))
    gap = seconds / (len(kinds) + 1)
    figures = soak(seconds, rate=5, fault_every=(gap * 0.8, gap * 1.2), seed=seed, kinds=kinds)
    report = "\n".join([f"seed {seed}", *figures.lines()])
    print(report)
    assert figures.lost == 0 and figures.changed == 0, report
    assert [fault.kind for fault in figures.faults] == kinds, report
    assert all(f.healed_s is not None and f.healed_s < 60 for f in figures.faults), report
    for slot, (warm, end, age) in figures.rss_mb.items():
        if age > 120:  # a process that lived through part of the load
            assert end - warm < 40, (slot, report)
    assert figures.warnings_per_min[1] < 300, report  # bounded: an outage is a few lines
