"""Cancel and resume with real Celery workers on Redis and PostgreSQL (issue 46, point 2):
jobs whose messages wait in the fast queue are never run, a running trajectory stops at
its next step, what finished is kept and exported, and a resumed batch runs only what
was cancelled."""

from __future__ import annotations

from common.backends.scripted import JobScript
from common.contracts import JobStatus, Stage
from common.pipeline.cancel import cancel_batch, resume_batch
from common.store.export import batch_rows
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
    steps = [len((j.trajectory or {}).get("steps", [])) for j in stopped]
    assert all(count < 3 for count in steps), steps  # none ran to its answer
    with made.sessions() as session:
        exported = {row["job_id"]: row["status"] for row in batch_rows(session, batch_id)}
    assert sorted(exported.values()) == ["cancelled", "cancelled", "done"]
    assert len(resume_batch(made.sessions, made.dispatcher, batch_id).job_ids) == 2
    again = made.follow(batch_id, deadline_s=60)
    assert again.counts.by_status[JobStatus.DONE] == 3, made.logs()
    assert made.jobs()[jobs["img000.png"]].finished_at == states[jobs["img000.png"]].finished_at
