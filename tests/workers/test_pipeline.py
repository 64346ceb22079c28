"""The distributed pipeline with real Celery workers (subprocesses) on Redis + PostgreSQL.

Each test has its own PostgreSQL database, Redis key prefix and queue names. Workers run
the scripted backend with per-job scripts from a file, so every route is exact.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from sqlalchemy import select

from common.backends.scripted import JobScript
from common.contracts import JobStatus, Stage
from common.pipeline.submit import submit_corpus
from common.sources.corpus import open_source
from common.store.tables import Job
from lab.ports import free_port
from tests.helpers.corpora import object_store, write_parquet, write_shards
from tests.helpers.deployment import Deployment
from tests.helpers.images import write_images
from tests.helpers.routes import ROUTES
from tests.helpers.sandbox import bubblewrap_or_skip
from tests.helpers.serving import SPECEYES
from tests.helpers.thyme_steps import ANSWER, CROP, LOOPS, RAISES
from tests.helpers.waiting import wait_until
from workers.queues import SLOW_PACK, priority_keys


def test_scripted_corpus_takes_exactly_its_routes_through_the_workers(tmp_path, deployment):
    setup = deployment(fast_batch_size="4", agent_max_steps="3", fast_max_wait_s="0.2")
    folder = tmp_path / "corpus"
    write_images(folder, len(ROUTES))
    (folder / "img010.png").write_bytes(b"\x89PNG\r\n\x1a\nbroken")  # corrupt: fails alone
    batch_id = setup.submit(folder)
    setup.script(batch_id, ROUTES)
    setup.start("fast")
    setup.start("slow")

    counts = setup.run(batch_id).counts

    assert counts.jobs == 11
    assert counts.by_answerer == {"small": 4, "large": 5}
    assert counts.failures == {"step_limit": 1, "image_error": 1}
    assert counts.by_defer_reason == {"tools_needed": 4, "low_confidence": 2}
    jobs = setup.jobs().values()
    assert all(job.attempts == 1 for job in jobs if job.error_code != "image_error")
    answers = {job.final_answer for job in jobs if job.answered_by == "large"}
    assert answers == {"T0", "T1", "T2", "U7", "U8"}


def test_a_poison_job_fails_alone_and_its_batch_is_recorded(tmp_path, deployment):
    # PostgreSQL refuses a NUL character in text: recording this answer fails the whole
    # batch's transaction, outside any model call. The batch is split until it stands alone.
    setup = deployment(fast_batch_size="8", fast_max_wait_s="0.2", retry_delay_s="0.1")
    folder = tmp_path / "corpus"
    write_images(folder, 8)
    batch_id = setup.submit(folder)
    scripts = {f"img{i:03d}.png": JobScript(answer=f"S{i}") for i in range(8)}
    scripts["img005.png"] = JobScript(answer="bad\x00answer")
    jobs = setup.script(batch_id, scripts)
    setup.start("fast")
    setup.start("slow")

    counts = setup.run(batch_id).counts

    assert counts.by_answerer == {"small": 7}
    assert counts.failures == {"internal_error": 1}
    poison = setup.jobs()[jobs["img005.png"]]
    assert poison.status == "failed" and poison.attempts == setup.settings.recovery.max_attempts
    assert "NUL" in (poison.error_message or "")


def _wait_running(setup: Deployment, stage: str) -> list[str]:
    def running() -> list[str]:
        return [
            j.id
            for j in setup.jobs().values()
            if j.status == JobStatus.RUNNING and j.stage == stage
        ]

    return wait_until(running, deadline_s=30, what=f"a job running in stage {stage}")


ZOOM = json.dumps({"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [2, 2, 30, 30]}})
ZOOM = f"<tool_call>{ZOOM}</tool_call>"


@pytest.mark.parametrize("pool", ["fast", "slow", "fast-zooming"])
@pytest.mark.faults
def test_a_killed_worker_loses_nothing_and_records_nothing_twice(tmp_path, deployment, pool):
    # Each batch / trajectory takes long enough to be killed in the middle of it;
    # "fast-zooming": at speculation depth 2, the small model's second zoom of four jobs
    zooming = pool == "fast-zooming"
    pool = "fast" if zooming else pool
    setup = deployment(
        fast_batch_size="4",
        fast_max_wait_s="0.2",
        visibility_timeout_s="6",
        scripted__tool_free="0" if pool == "slow" else "1",
        scripted__fast_batch_s="2" if pool == "fast" and not zooming else "0",
        scripted__agent_step_s="2" if pool == "slow" else "0",
        scripted__zoom_step_s="1" if zooming else "0",
        speculation_depth="2" if zooming else "0",
    )
    folder = tmp_path / "corpus"
    write_images(folder, 8)
    batch_id = setup.submit(folder)
    if zooming:  # two zooms, then the answer: three rounds of a second each
        script = JobScript(zoom_steps=(ZOOM, ZOOM, "<answer>Z</answer>"))
        setup.script(batch_id, {f"img{i:03d}.png": script for i in range(8)})
    setup.start("fast")
    setup.start("slow")
    setup.send(batch_id)

    victim = setup.workers[0 if pool == "fast" else 1]
    in_flight = _wait_running(setup, Stage.FAST if pool == "fast" else Stage.AGENT)
    victim.kill()
    setup.start(pool)

    deadline = setup.settings.broker.visibility_timeout_s + 60
    result = setup.follow(batch_id, deadline)
    assert result.counts.finished == result.counts.jobs == 8, setup.logs()
    jobs = setup.jobs()
    assert all(job.status == "done" for job in jobs.values())
    expected = "small" if pool == "fast" else "large"
    assert all(job.answered_by == expected for job in jobs.values())
    if zooming:  # each job's zooms are those of the run that finished it, once
        assert {len(job.zoom_steps or []) for job in jobs.values()} == {3}
        assert {job.final_answer for job in jobs.values()} == {"Z"}
    # the killed work was redone once; nothing else ran twice
    assert {jobs[job_id].attempts for job_id in in_flight} == {2}
    assert all(job.attempts == 1 for job_id, job in jobs.items() if job_id not in in_flight)


@pytest.mark.faults
def test_a_job_that_kills_its_worker_fails_alone(tmp_path, deployment):
    # The scripted model exits the process (as a segfault would) on one job's screen.
    setup = deployment(
        fast_batch_size="4", fast_max_wait_s="0.2", visibility_timeout_s="4", max_attempts="2"
    )
    folder = tmp_path / "corpus"
    write_images(folder, 4)
    batch_id = setup.submit(folder)
    scripts = {f"img{i:03d}.png": JobScript(answer=f"S{i}") for i in range(4)}
    scripts["img002.png"] = JobScript(crash=frozenset({"screen"}))
    jobs = setup.script(batch_id, scripts)
    setup.send(batch_id)

    for _ in range(2):  # dies with the whole batch, then with the poison alone
        worker = setup.start("fast", wait=False)  # it may die before we see it ready
        wait_until(
            lambda w=worker: w.process.poll() is not None,
            deadline_s=60,
            what="the poison to kill the worker",
        )
        assert worker.process.returncode == 70
    setup.start("fast")

    result = setup.follow(batch_id, 60)
    assert result.counts.finished == 4, setup.logs()
    states = setup.jobs()
    poison = states.pop(jobs["img002.png"])
    assert (poison.status, poison.error_code) == ("failed", "attempts_exhausted")
    assert {job.status for job in states.values()} == {"done"}
    # the killed batch, then alone (a worker runs the first half of its first batch
    # on its own, so a job there may be done before the poison kills the rest)
    attempts = [job.attempts for job in states.values()]
    assert set(attempts) <= {1, 2} and attempts.count(2) >= 1, attempts


@pytest.mark.sandbox
def test_a_thyme_slow_worker_runs_code_in_the_sandbox_and_survives_hostile_code(
    tmp_path, deployment
):
    bubblewrap_or_skip()
    setup = deployment(
        agent="thyme", baseline="true", fast_max_wait_s="0.2", sandbox_wall_s="2", sandbox_cpu_s="2"
    )
    folder = tmp_path / "corpus"
    write_images(folder, 4)
    batch_id = setup.submit(folder)
    steal = "<code>\n```python\nprint(dict(os.environ))\n```\n</code>"
    jobs = setup.script(
        batch_id,
        {
            "img000.png": JobScript(agent_steps=(CROP, ANSWER)),
            "img001.png": JobScript(agent_steps=(LOOPS, ANSWER)),
            "img002.png": JobScript(agent_steps=(RAISES, ANSWER)),
            "img003.png": JobScript(agent_steps=(steal, ANSWER)),
        },
    )
    setup.start("fast")
    slow = setup.start("slow")

    counts = setup.run(batch_id, deadline_s=90).counts

    assert counts.by_answerer == {"large": 4}, counts
    assert slow.process.poll() is None  # the worker carried on
    by_job = setup.jobs()
    steps = {item: by_job[job_id].trajectory["steps"] for item, job_id in jobs.items()}
    assert steps["img000.png"][0]["images"][0]["width"] == 64
    assert steps["img001.png"][0]["sandbox_stop"] in ("timeout", "cpu_limit")
    assert "ValueError" in steps["img002.png"][0]["observation"]
    printed = steps["img003.png"][0]["code_output"]
    assert "LANG" in printed and "SPECEYES" not in printed and "redis://" not in printed


def test_one_slow_worker_runs_concurrent_trajectories(tmp_path, deployment):
    setup = deployment(baseline="true", fast_max_wait_s="0.2", scripted__agent_step_s="0.5")
    folder = tmp_path / "corpus"
    write_images(folder, 4)
    batch_id = setup.submit(folder)
    setup.start("fast")
    setup.start("slow", "--concurrency", "4")

    assert setup.run(batch_id).counts.by_answerer == {"large": 4}
    spans = [(job.agent_started_at, job.finished_at) for job in setup.jobs().values()]
    overlapping = max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)
    assert overlapping >= 2, spans  # trajectories ran at the same time, in one worker


@pytest.mark.sandbox
def test_a_thyme_slow_worker_refuses_to_start_without_its_sandbox(tmp_path, deployment):
    setup = deployment(agent="thyme", sandbox_bwrap="no-such-bwrap")
    worker = setup.start("slow", wait=False)
    assert worker.process.wait(timeout=60) == 2
    log = worker.log_path.read_text()
    assert "needs bubblewrap" in log and "Traceback" not in log


@pytest.mark.parametrize("agent", ["deepeyes", "thyme"])
@pytest.mark.sandbox
def test_the_tiny_checkpoints_run_through_the_workers(tmp_path, deployment, tiny_cache_dir, agent):
    if agent == "thyme":
        bubblewrap_or_skip()
    setup = deployment(
        agent=agent,
        backend="transformers",
        small_model="tiny",
        large_model="tiny",
        cache_dir=str(tiny_cache_dir),
        device="cpu",
        fast_batch_size="4",
        fast_max_wait_s="0.2",
        agent_max_steps="2",
        agent_max_new_tokens="12",
        # every job speculated; the random small model's confidences on these images lie
        # between 0.856 and 0.867, so this threshold sends some on to the agent
        screener="none",
        gate_threshold="0.862",
    )
    folder = tmp_path / "corpus"
    write_images(folder, 6, size=(96, 80))
    batch_id = setup.submit(folder)
    setup.start("fast")
    setup.start("slow")

    counts = setup.run(batch_id, deadline_s=120).counts

    assert counts.jobs == counts.speculated == 6
    if agent == "deepeyes":  # (Thyme's phase II text gives other confidences)
        assert 0 < counts.accepted < 6, counts  # both routes taken
    assert counts.by_defer_reason == {"low_confidence": 6 - counts.accepted}
    jobs = setup.jobs().values()
    for job in jobs:
        assert job.attempts == 1 and job.confidence is not None
        if job.answered_by == "small":
            assert job.confidence > 0.862 and job.final_answer == job.small_answer
        elif job.status == "done":
            assert job.answered_by == "large" and job.trajectory["steps"]
        else:  # random text rarely follows the DeepEyes protocol: a clear error, not a guess
            assert job.confidence <= 0.862, job.confidence
            assert job.error_code in ("step_limit", "tool_call_invalid", "no_answer"), job
            assert len(job.trajectory["steps"]) <= 2


def test_annotate_distributed_follows_the_workers_and_they_export_metrics(tmp_path, deployment):
    import subprocess
    import urllib.request

    setup = deployment(fast_batch_size="4", fast_max_wait_s="0.2")
    folder = tmp_path / "corpus"
    write_images(folder, 10)
    port = free_port()
    setup.start("fast", "--metrics-port", str(port))
    setup.start("slow")

    run = subprocess.run(
        [
            *SPECEYES,
            "annotate",
            str(folder),
            "-q",
            "What is it?",
            "--distributed",
            "--no-progress",
            "--out",
            str(tmp_path / "out.jsonl"),
        ],
        env={**os.environ, **setup.env},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert run.returncode == 0, run.stdout + run.stderr
    assert "sent 10 jobs to the fast queue" in run.stdout
    assert "done         10: small model 10" in run.stdout
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 10
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    assert 'speceyes_jobs_total{outcome="accepted",stage="fast"} 10.0' in metrics
    assert "speceyes_fast_batch_size_count" in metrics
    queue = setup.settings.broker.fast_queue
    assert f'speceyes_queue_depth{{queue="{queue}"}} 0.0' in metrics


def test_distributed_without_a_broker_is_a_usage_error(tmp_path):
    import subprocess

    write_images(tmp_path / "corpus", 1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECEYES_")}
    run = subprocess.run(
        [
            *SPECEYES,
            "annotate",
            str(tmp_path / "corpus"),
            "-q",
            "Q?",
            "--distributed",
            "--db",
            f"sqlite:///{tmp_path / 's.db'}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "--distributed needs a broker" in run.stderr


def test_a_slow_worker_takes_audits_only_after_the_deferred_jobs_waiting_with_them(
    tmp_path, deployment
):
    from common.contracts import Accepted, DeferReason, Deferred, ScreenResult
    from common.store import audits, claims

    made = deployment(agent_max_steps="2")
    folder = tmp_path / "imgs"
    write_images(folder, 6)
    batch_id = made.submit(folder)
    with made.sessions.begin() as session:
        tickets = claims.claim(session, Stage.FAST, 10, batch_id)
        screen = ScreenResult(False, "no")
        outcomes = [Deferred(t.job_id, DeferReason.LOW_CONFIDENCE, screen) for t in tickets[:3]]
        outcomes += [Accepted(t.job_id, "A", 0.999, [9.0], screen) for t in tickets[3:]]
        claims.record_fast(session, outcomes, made.settings.funnel.gate)
        audited = audits.request(session, [t.job_id for t in tickets[3:]])
    deferred = [t.job_id for t in tickets[:3]]
    made.dispatcher.send_audit(audited)  # the audits are on the broker first ...
    made.dispatcher.send_slow(deferred)  # ... yet the deferred jobs go before them
    made.start("slow")
    with made.sessions() as session:

        def all_audited() -> bool:
            session.expire_all()
            return audits.counts(session, batch_id)[0] == 3

        wait_until(all_audited, deadline_s=60, what="the audits")
        jobs = made.jobs()
    last_deferred = max(jobs[j].finished_at for j in deferred)
    first_audit = min(jobs[j].audited_at for j in audited)
    assert last_deferred <= first_audit, made.logs()
    assert {jobs[j].audit_agrees for j in audited} == {True}  # scripted: the agent says A too


def test_distributed_audits_raise_the_batchs_drift_alarm_and_pause(tmp_path, deployment):
    from common.store import audits
    from common.store.tables import Batch

    setup = deployment(audit_rate="1.0", audit_on_drift="pause", fast_max_wait_s="0.2")
    folder = tmp_path / "corpus"
    write_images(folder, 8)
    batch_id = setup.submit(folder)
    setup.script(
        batch_id, {f"img00{i}.png": JobScript(answer="A", agent_answer="B") for i in range(8)}
    )
    setup.start("fast")
    setup.start("slow")
    setup.run(batch_id)  # every job final: accepted, each answer "A"
    with setup.sessions() as session:

        def raised() -> dict | None:
            session.expire_all()
            return session.get(Batch, batch_id).audit_alarm

        alarm = wait_until(raised, deadline_s=60, what="the drift alarm")
        assert alarm["agreed"] == 0 and alarm["action"].startswith("paused")
        assert audits.controls(session) == {"paused": True}
    assert {job.final_answer for job in setup.jobs().values()} == {"A"}  # answers stand


@pytest.mark.faults
def test_sigterm_hands_a_fast_workers_buffered_messages_back_and_exits_0(tmp_path, deployment):
    """What `worker --help` promises: a warm shutdown returns what was taken, not run."""
    import signal

    made = deployment(fast_max_wait_s="60", fast_batch_size="32")  # the batch never fills
    folder = tmp_path / "imgs"
    write_images(folder, 5)
    batch_id = made.submit(folder)
    worker = made.start("fast")
    made.send(batch_id)
    wait_until(
        lambda: (
            len(made.dispatcher.message_ids(held=False)) == 0
            and len(made.dispatcher.message_ids()) == 5
        ),
        deadline_s=30,
        what="the worker to take the message of 5 jobs",
    )
    worker.process.send_signal(signal.SIGTERM)
    assert worker.process.wait(timeout=60) == 0
    assert made.dispatcher.queue_depths()[made.settings.broker.fast_queue] == 1  # back: 1 message
    assert len(made.dispatcher.message_ids(held=False)) == 5  # (of 5 ids)
    assert {job.status for job in made.jobs().values()} == {JobStatus.QUEUED}


@pytest.mark.faults
def test_sigterm_mid_flush_finishes_the_running_batch_and_hands_the_rest_back(tmp_path, deployment):
    """A flush of full messages is many micro-batches: a SIGTERM lets the running one
    finish and sends the others back, unclaimed, before the flush is acknowledged."""
    import signal

    made = deployment(fast_batch_size="2", fast_max_wait_s="0.2", scripted__fast_batch_s="1")
    folder = tmp_path / "imgs"
    write_images(folder, 4)  # one flush: 2 messages of 2 ids, 2 micro-batches of 1 s
    batch_id = made.submit(folder)
    worker = made.start("fast")
    made.send(batch_id)
    wait_until(
        lambda: any(job.status == JobStatus.RUNNING for job in made.jobs().values()),
        deadline_s=30,
        what="the first micro-batch to run",
    )
    worker.process.send_signal(signal.SIGTERM)
    assert worker.process.wait(timeout=60) == 0
    statuses = sorted(job.status for job in made.jobs().values())
    assert statuses == [JobStatus.DONE] * 2 + [JobStatus.QUEUED] * 2
    queued = {job.id for job in made.jobs().values() if job.status == JobStatus.QUEUED}
    assert made.dispatcher.message_ids(held=False) == queued  # handed back, still waiting
    assert all(job.attempts == 0 for job in made.jobs().values() if job.id in queued)


@pytest.mark.faults
def test_sigterm_lets_a_slow_workers_trajectory_finish_then_exits_0(tmp_path, deployment):
    import signal

    made = deployment(scripted__tool_free="0", scripted__agent_step_s="2")
    folder = tmp_path / "imgs"
    write_images(folder, 1)
    batch_id = made.submit(folder)
    made.start("fast")
    slow = made.start("slow")
    made.send(batch_id)

    def running() -> bool:
        return any(
            j.status == JobStatus.RUNNING and j.stage == Stage.AGENT for j in made.jobs().values()
        )

    wait_until(running, deadline_s=30, what="the trajectory to start")
    slow.process.send_signal(signal.SIGTERM)
    assert slow.process.wait(timeout=60) == 0
    assert [job.status for job in made.jobs().values()] == [JobStatus.DONE]  # finished first


def _through_the_fast_worker(made, folder: Path, until: str) -> set[str]:
    """Submit ``folder``, let a fast worker defer every job (tool_free 0) and wait until
    each is ``until``; their ids."""
    batch_id = made.submit(folder)
    fast = made.start("fast")
    made.send(batch_id)
    wait_until(
        lambda: all(job.status == until for job in made.jobs().values()),
        deadline_s=60,
        what=f"every job to be {until}",
    )
    fast.stop()
    return set(made.jobs())


@pytest.mark.faults
def test_sigterm_mid_slow_message_finishes_its_trajectory_and_hands_the_rest_back(
    tmp_path, deployment
):
    """Deferred jobs travel packed; a worker told to stop finishes the trajectory it runs
    and sends the message's others back, unclaimed."""
    import signal

    made = deployment(fast_batch_size="4", scripted__tool_free="0", scripted__agent_step_s="2")
    write_images(tmp_path / "imgs", 6)
    # 3 slow messages of 2: the first micro-batch (4) runs in halves, then the other 2
    ids = _through_the_fast_worker(made, tmp_path / "imgs", JobStatus.DEFERRED)
    assert made.dispatcher.queue_depths()[made.settings.broker.slow_queue] == 3
    slow = made.start("slow")  # takes one; the others wait, so it is not unpacked

    def running() -> bool:
        return any(job.status == JobStatus.RUNNING for job in made.jobs().values())

    wait_until(running, deadline_s=30, what="the first trajectory to start")
    slow.process.send_signal(signal.SIGTERM)
    assert slow.process.wait(timeout=60) == 0
    jobs = made.jobs()
    statuses = sorted(job.status for job in jobs.values())
    assert statuses == [JobStatus.DEFERRED] * 5 + [JobStatus.DONE]
    waiting = {job_id for job_id in ids if jobs[job_id].status == JobStatus.DEFERRED}
    assert made.dispatcher.message_ids(held=False) == waiting  # handed back, still waiting
    assert all(jobs[job_id].attempts == 0 for job_id in waiting)


def test_a_slow_message_is_unpacked_for_an_idle_worker(tmp_path, deployment, redis_client):
    """A packed message taken while no other waits goes to every free worker: the two
    jobs of one message run on two slow workers, not one after another on one."""
    made = deployment(scripted__tool_free="0", scripted__agent_step_s="1")
    write_images(tmp_path / "imgs", 2)
    ids = _through_the_fast_worker(made, tmp_path / "imgs", JobStatus.DEFERRED)
    broker = made.settings.broker
    # (the fast worker's messages, on each of the queue's priority steps)
    redis_client.delete(*(broker.key_prefix + key for key in priority_keys(broker.slow_queue)))
    for _ in range(2):
        made.start("slow")  # both idle before the message comes
    made.dispatcher.send_slow(sorted(ids))  # one message of both
    wait_until(
        lambda: all(job.status == JobStatus.DONE for job in made.jobs().values()),
        deadline_s=60,
        what="both trajectories",
    )
    assert len({made.jobs()[job_id].worker for job_id in ids}) == 2


def test_workers_read_referenced_images_where_they_lie_checked_by_digest(tmp_path, deployment):
    """Shards and a table on an S3-compatible server (moto: no real S3 here): the workers
    read each image from its tar member or Parquet row, nothing is copied into the
    upload store, and the member replaced after submission fails its job alone."""
    uploads = tmp_path / "uploads"
    setup = deployment(fast_batch_size="4", upload_dir=str(uploads))
    write_shards(tmp_path / "corpus" / "shards", shards=2, per_shard=3)
    write_parquet(tmp_path / "corpus" / "t.parquet", 5, row_group_size=2)
    with object_store() as store:
        base = store.upload(tmp_path / "corpus", "corpus")
        batches = []
        for source in (f"{base}/shards/{{00000..00001}}.tar", f"{base}/t.parquet"):
            corpus = open_source(source, settings=setup.settings)
            submitted = submit_corpus(
                setup.sessions,
                corpus.rows,
                source=corpus.location,
                name="t",
                settings=setup.settings,
            )
            batches.append(submitted.batch_id)
        shard = bytearray((tmp_path / "corpus" / "shards" / "00001.tar").read_bytes())
        with setup.sessions() as session:
            job = session.scalar(
                select(Job).where(Job.image_path.contains('"member":"000004.png"'))
            )
            place = json.loads(job.image_path)
        shard[place["offset"] : place["offset"] + 8] = b"replaced"  # same size, other bytes
        store.put("corpus/shards/00001.tar", bytes(shard))
        setup.start("fast")
        setup.start("slow")

        shard_counts = setup.run(batches[0]).counts
        table_counts = setup.run(batches[1]).counts

    assert shard_counts.jobs == 6 and shard_counts.failures == {"image_changed": 1}
    assert table_counts.jobs == 5 and not table_counts.failures
    changed = setup.jobs()[job.id]
    assert (
        changed.error_message
        == "s3://corpus/shards/00001.tar member 000004.png changed since it was submitted"
    )
    assert not uploads.exists()


def test_a_submission_sends_one_fast_message_per_micro_batch(deployment):
    """The broker's cost is paid per batch: 70 ids at a batch size of 32 are 3 messages,
    and the reconciler still reads every id in them; deferred ids go SLOW_PACK a message,
    or one each when asked."""
    made = deployment(fast_batch_size="32")
    ids = [f"{n:032x}" for n in range(70)]
    assert made.dispatcher.send_fast(ids) == 70
    assert made.dispatcher.queue_depths()[made.settings.broker.fast_queue] == 3
    assert made.dispatcher.message_ids(held=False) == set(ids)
    slow = made.settings.broker.slow_queue
    made.dispatcher.send_slow(ids[: SLOW_PACK + 2])
    assert made.dispatcher.queue_depths()[slow] == 2  # SLOW_PACK ids, then the other 2
    made.dispatcher.send_slow(ids[:3], one_each=True)  # (a worker unpacking for idle ones)
    assert made.dispatcher.queue_depths()[slow] == 5
