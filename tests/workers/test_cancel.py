"""Cancel, resume and priorities with real Celery workers on Redis and PostgreSQL (issue
46, points 2 and 3): jobs whose messages wait in the fast queue are never run, a running
trajectory stops at its next step, what finished is kept and exported, a resumed batch
runs only what was cancelled, and a single high job overtakes a queued corpus."""

from __future__ import annotations

from dataclasses import replace

from common.backends.scripted import JobScript
from common.contracts import JobStatus, Stage
from common.images import content_hash
from common.pipeline.cancel import cancel_batch, resume_batch
from common.store.export import batch_rows
from common.store.new_jobs import NewItem
from common.store.submission import submit_job
from tests.helpers.images import write_images
from tests.helpers.waiting import wait_until

THREE_STEPS = JobScript(
    needs_tools=True, agent_steps=("<think>a</think>", "<think>b</think>", "<answer>B</answer>")
)


def test_a_batch_cancelled_in_the_fast_queue_is_never_run_and_resumes_whole(tmp_path, deployment):
    made = deployment(fast_batch_size="4", fast_max_wait_s="0.2")
    write_images(tmp_path / "imgs", 4)
    batch_id = made.submit(tmp_path / "imgs")
    made.send(batch_id)  # four messages wait in the fast queue; no worker yet
    with made.sessions.begin() as session:
        assert cancel_batch(session, batch_id).cancelled == 4
    fast = made.start("fast")
    wait_until(
        lambda: made.dispatcher.queue_depths()[made.settings.broker.fast_queue] == 0,
        deadline_s=30,
        what="the fast worker to take the cancelled jobs' messages",
    )
    assert {job.status for job in made.jobs().values()} == {JobStatus.CANCELLED}
    assert all(job.fast_started_at is None for job in made.jobs().values())  # never claimed
    made.start("slow")
    assert len(resume_batch(made.sessions, made.dispatcher, batch_id).job_ids) == 4
    result = made.follow(batch_id)
    assert result.counts.by_status[JobStatus.DONE] == 4, made.logs()
    fast.stop()


def test_a_running_trajectory_stops_at_its_next_step_and_the_finished_part_is_kept(
    tmp_path, deployment
):
    made = deployment(scripted__agent_step_s="1", agent_max_steps="5")
    write_images(tmp_path / "imgs", 3)
    batch_id = made.submit(tmp_path / "imgs")
    jobs = made.script(
        batch_id,
        {"img000.png": JobScript(), "img001.png": THREE_STEPS, "img002.png": THREE_STEPS},
    )
    made.start("fast")
    made.start("slow")  # (one trajectory at a time: the default)
    made.send(batch_id)

    def one_trajectory_running() -> bool:
        states = made.jobs()
        done = states[jobs["img000.png"]].status == JobStatus.DONE
        running = [j for j in states.values() if j.status == JobStatus.RUNNING]
        return done and any(j.stage == Stage.AGENT for j in running)

    wait_until(one_trajectory_running, deadline_s=60, what="the first trajectory to start")
    with made.sessions.begin() as session:
        result = cancel_batch(session, batch_id)
    assert (result.stopping, result.finished) == (1, 1), result
    follow = made.follow(batch_id, deadline_s=30)
    assert follow.counts.finished == 3, made.logs()
    states = made.jobs()
    assert states[jobs["img000.png"]].status == JobStatus.DONE  # kept
    stopped = [j for j in states.values() if j.status == JobStatus.CANCELLED]
    assert len(stopped) == 2
    steps = sorted(len((j.trajectory or {}).get("steps", [])) for j in stopped)
    # the one that waited ran no step; the one stopped keeps the steps it took, none of
    # them its answer, and says why it ended
    assert steps[0] == 0 and 1 <= steps[1] < 3, steps
    (partial,) = [j.trajectory for j in stopped if j.trajectory and j.trajectory.get("steps")]
    assert partial["error_code"] == "cancelled" and partial.get("answer") is None, partial
    with made.sessions() as session:
        exported = {row["job_id"]: row["status"] for row in batch_rows(session, batch_id)}
    assert sorted(exported.values()) == ["cancelled", "cancelled", "done"]
    assert len(resume_batch(made.sessions, made.dispatcher, batch_id).job_ids) == 2
    again = made.follow(batch_id, deadline_s=60)
    assert again.counts.by_status[JobStatus.DONE] == 3, made.logs()
    assert made.jobs()[jobs["img000.png"]].finished_at == states[jobs["img000.png"]].finished_at


def test_a_single_high_job_overtakes_a_corpus_waiting_in_the_fast_queue(tmp_path, deployment):
    """Priority with Celery on Redis: the single job's message is on the broker's high
    step, taken before the corpus's messages that were sent first."""
    made = deployment(fast_batch_size="4", fast_max_wait_s="0.1", scripted__fast_batch_s="0.3")
    write_images(tmp_path / "corpus", 48)
    batch_id = made.submit(tmp_path / "corpus")
    made.send(batch_id)  # twelve micro-batches wait, sent first
    write_images(tmp_path / "single", 49)
    single = tmp_path / "single" / "img048.png"
    item = NewItem(0, "alone", "What is it?", image_path=str(single), priority=0)
    item = replace(item, image_hash=content_hash(single.read_bytes()))
    with made.dispatcher.transaction(made.sessions) as outbox:
        job_id = submit_job(outbox.session, item, client_key=None, batch_id=None).id
        outbox.to_fast([job_id])
    made.start("fast")
    wait_until(lambda: made.jobs()[job_id].status == JobStatus.DONE, deadline_s=60, what="the job")
    corpus = [job for job in made.jobs().values() if job.id != job_id]
    waiting = sum(job.status != JobStatus.DONE for job in corpus)
    assert waiting >= 24, waiting  # it did not wait for the corpus's messages
