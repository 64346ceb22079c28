"""The unit of work: redelivered, duplicated and poisonous jobs (in-process, no broker)."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import update

from common.backends import Models
from common.backends.scripted import JobScript, ScriptedModel
from common.config import Settings
from common.contracts import CancelReason, JobStatus, Stage
from common.pipeline.dispatch import StoreOnly
from common.pipeline.work import AgentWork, FastWork
from common.store import cancels
from common.store.tables import Job
from tests.helpers.images import write_images
from tests.helpers.work import jobs, running_since, stage, submit


def test_a_second_delivery_changes_nothing_and_passes_deferred_jobs_on(sessions, tmp_path):
    ids = submit(sessions, tmp_path, 4)
    fast, _ = stage(sessions, {ids[0]: JobScript(needs_tools=True)})
    first = fast.run_ids(ids)
    assert first.to_slow == [ids[0]] and len(first.outcomes) == 4
    assert fast.dispatcher.sent_slow == [ids[0]]  # sent on, after its batch committed
    before = jobs(sessions)

    again = fast.run_ids(ids)  # the same message delivered again

    assert again.outcomes == [] and again.skipped == 3  # finished; the 4th is passed on
    assert again.to_slow == [ids[0]]  # it may not have reached the slow queue the first time
    after = jobs(sessions)
    assert [(j.status, j.finished_at, j.attempts) for j in after.values()] == [
        (j.status, j.finished_at, j.attempts) for j in before.values()
    ]


def test_running_jobs_are_taken_over_only_when_stale_or_handed_back(sessions, tmp_path):
    ids = submit(sessions, tmp_path, 3)
    fast, _ = stage(sessions, {})
    running_since(sessions, ids[0], 5)  # a live worker holds it
    running_since(sessions, ids[1], 45)  # its worker died: older than half the timeout

    report = fast.run_ids(ids)

    states = jobs(sessions)
    assert states[ids[0]].status == JobStatus.RUNNING and report.skipped == 1
    assert states[ids[1]].status == "done" and states[ids[1]].attempts == 2
    assert states[ids[2]].status == "done" and states[ids[2]].attempts == 1
    fast.run_ids([ids[0]], takeover=True)  # its own worker sent it back
    assert jobs(sessions)[ids[0]].status == "done"


def test_a_job_that_keeps_killing_its_worker_runs_alone_then_fails(sessions, tmp_path):
    ids = submit(sessions, tmp_path, 4)
    fast, model = stage(sessions, {}, max_attempts=2)
    running_since(sessions, ids[0], 45)  # delivered before: attempts 1 -> 2 on this claim
    fast.run_ids(ids)
    # the suspect went in a batch of its own, after the three fresh jobs
    assert [size for phase, size in model.batch_sizes if phase == "screen"] == [3, 1]

    running_since(sessions, ids[1], 45)
    with sessions.begin() as session:  # as if its worker died on its 2nd attempt too
        session.execute(update(Job).where(Job.id == ids[1]).values(attempts=2))
    fast.run_ids([ids[1]])
    job = jobs(sessions)[ids[1]]
    assert (job.status, job.error_code) == ("failed", "attempts_exhausted")
    assert "gave up after 2 attempts" in (job.error_message or "")


def test_an_agent_job_is_run_once_however_often_its_message_comes(sessions, tmp_path):
    ids = submit(sessions, tmp_path, 1)
    model = ScriptedModel({ids[0]: JobScript(needs_tools=True, agent_answer="B")})
    config = Settings(backend="scripted", visibility_timeout_s=60)
    FastWork(sessions, Models(model, model), config, StoreOnly()).run_ids(ids)
    agent = AgentWork(sessions, Models(model, model), config, StoreOnly())

    first, second = agent.run_id(ids[0]), agent.run_id(ids[0])

    assert "agent" in first.seconds and second.skipped == 1
    assert model.calls["generate"] == 1
    job = jobs(sessions)[ids[0]]
    assert (job.status, job.final_answer, job.stage) == ("done", "B", Stage.AGENT)


def test_a_specreason_job_waits_for_the_agent_stage_which_runs_specreason(sessions, tmp_path):
    """Submitted with --method specreason: no fast stage at all; the slow stage's worker
    (whatever its own --method) runs SpecReason's rounds on it, its threshold applied."""
    ids = submit(sessions, tmp_path, 1, method="specreason")
    script = JobScript(proposals=("<think>a</think>", "<answer>B</answer>"), scores=(6, 9))
    model = ScriptedModel({ids[0]: script}, default=lambda _: script)
    config = Settings(backend="scripted", visibility_timeout_s=60, specreason_threshold=5.0)
    # a fast-stage delivery of it (a stray message) passes it on, deciding nothing
    passed = FastWork(sessions, Models(model, model), config, StoreOnly()).run_ids(ids)
    assert passed.to_slow == ids and not passed.outcomes
    AgentWork(sessions, Models(model, model), config, StoreOnly()).run_id(ids[0])

    job = jobs(sessions)[ids[0]]
    assert (job.status, job.final_answer, job.defer_reason) == ("done", "B", "specreason")
    assert [(s["proposer"], s["score"]) for s in job.trace_steps] == [("small", 6), ("small", 9)]
    assert model.calls["screen"] == model.calls["speculate"] == 0


def test_a_model_server_outage_sends_the_batch_back_without_using_attempts(sessions, tmp_path):
    from common.errors import BackendUnavailable

    class Down(ScriptedModel):
        def screen(self, queries, *, max_new_tokens):
            raise BackendUnavailable("model server at :9000 refused the connection")

    ids = submit(sessions, tmp_path, 3)
    model = Down({})
    dispatcher = StoreOnly()
    fast = FastWork(sessions, Models(model, model), Settings(backend="scripted"), dispatcher)

    report = fast.run_ids(ids)

    assert sorted(report.retry) == sorted(ids) and report.outcomes == []
    assert sorted(dispatcher.sent_fast) == sorted(ids)  # sent again, after the release
    states = jobs(sessions)
    assert {(job.status, job.attempts) for job in states.values()} == {("queued", 0)}


def test_a_batch_of_large_images_runs_in_groups_within_the_pixel_budget(tmp_path):
    from common.contracts import Ticket
    from common.pipeline.work.unit import pixel_groups

    paths = write_images(tmp_path, 5, size=(100, 100))  # 10,000 pixels each
    tickets = [Ticket(f"j{i}", str(path), None, "Q?", None) for i, path in enumerate(paths)]
    tickets.append(Ticket("broken", str(tmp_path / "missing.png"), None, "Q?", None))
    groups = pixel_groups(tickets, budget=25_000)
    assert [[t.job_id for t in group] for group in groups] == [
        ["j0", "j1"],
        ["j2", "j3"],
        ["j4", "broken"],  # an unreadable one counts nothing
    ]
    assert [len(group) for group in pixel_groups(tickets, budget=5_000)] == [1] * 6  # alone


def test_jobs_handed_back_after_a_try_are_claimed_and_run_one_at_a_time(
    sessions, tmp_path, monkeypatch
):
    """Jobs a dead worker held come back queued with their attempt used (the reconciler's
    ``release_orphans``): each is claimed only when it runs, alone, so a job that kills
    its worker uses up its own attempts, never those of the jobs delivered with it."""
    ids = submit(sessions, tmp_path, 4)
    with sessions.begin() as session:
        session.execute(update(Job).where(Job.id.in_(ids[2:])).values(attempts=1))
    fast, model = stage(sessions, {})
    screen = model.screen

    def kills_its_worker(queries, **kwargs):
        if any(query.job_id == ids[2] for query in queries):
            raise SystemExit("the worker died")  # (nothing of the process's code runs on)
        return screen(queries, **kwargs)

    monkeypatch.setattr(model, "screen", kills_its_worker)
    with pytest.raises(SystemExit):
        fast.run_ids(ids)

    after = jobs(sessions)
    assert [after[i].status for i in ids[:2]] == [JobStatus.DONE] * 2  # the untried batch
    assert (after[ids[2]].status, after[ids[2]].attempts) == (JobStatus.RUNNING, 2)  # its own
    assert (after[ids[3]].status, after[ids[3]].attempts) == (JobStatus.QUEUED, 1)  # untouched


def test_a_trajectory_cancelled_while_it_runs_stops_before_its_next_step(sessions, tmp_path):
    """A cancel that arrives during a step: that step finishes, the next generation never
    starts, and the job ends cancelled (not failed, not retried)."""
    ids = submit(sessions, tmp_path, 1)
    steps = ("<think>let me look closer</think>", "<answer>B</answer>")

    class CancelledDuringStep(ScriptedModel):
        def generate(self, conversation, **options):
            if self.calls["generate"] == 0:  # the caller cancels while the first step runs
                with sessions.begin() as session:
                    cancels.cancel(session, [ids[0]], CancelReason.CANCELLED)
            return super().generate(conversation, **options)

    model = CancelledDuringStep({ids[0]: JobScript(needs_tools=True, agent_steps=steps)})
    config = Settings(backend="scripted", visibility_timeout_s=60)
    FastWork(sessions, Models(model, model), config, StoreOnly()).run_ids(ids)
    report = AgentWork(sessions, Models(model, model), config, StoreOnly()).run_id(ids[0])
    assert report.cancelled == 1 and report.failed == 0
    assert model.calls["generate"] == 1
    job = jobs(sessions)[ids[0]]
    assert (job.status, job.error_code, job.final_answer) == ("cancelled", "cancelled", None)
    assert job.cancel_requested is None and job.worker is None
    # the step it took is kept, and what it cost (a cancelled job's compute was spent)
    (step,) = job.trajectory["steps"]
    assert job.agent_usage["turns"] == [
        [step["prompt_tokens"], step["new_tokens"], round(step["generate_seconds"], 6)]
    ]


def test_a_restarted_workers_first_batch_is_split_and_each_job_screened_once(sessions, tmp_path):
    """``split_first`` halves the first group (a crash may have come from it); every
    group after it runs as it is, and no job is screened twice."""
    ids = submit(sessions, tmp_path, 9)  # 64 x 48 images: 3,072 pixels each
    fast, model = stage(sessions, {}, fast_batch_pixels=10_000)  # groups of three
    fast = FastWork(fast.sessions, fast.models, fast.settings, StoreOnly(), split_first=True)
    report = fast.run_ids(ids[:6])
    assert len(report.outcomes) == 6
    fast.run_ids(ids[6:])  # (only the first batch is split)
    screened = [size for phase, size in model.batch_sizes if phase == "screen"]
    assert screened == [1, 2, 3, 3]
    assert {job.status for job in jobs(sessions).values()} == {JobStatus.DONE}


def test_a_run_says_how_long_each_part_took(sessions, tmp_path):
    ids = submit(sessions, tmp_path, 3)
    fast, _ = stage(sessions, {})
    started = time.perf_counter()
    report = fast.run_ids(ids)
    took = time.perf_counter() - started
    for part in ("claim", "load", "record", "send"):
        assert 0.0 <= report.seconds[part] <= took, (part, report.seconds)


def test_an_audit_pause_defers_every_job_to_the_agent(sessions, tmp_path):
    from common.store import audits

    ids = submit(sessions, tmp_path, 3)
    with sessions.begin() as session:
        audits.set_control(session, "paused", True)
    fast, model = stage(sessions, {})
    report = fast.run_ids(ids)
    assert sorted(report.to_slow) == sorted(ids) and model.calls["screen"] == 0
    assert {job.defer_reason for job in jobs(sessions).values()} == {"audit_paused"}


def test_the_audit_samples_accepted_answers_at_its_rate(sessions, tmp_path):
    ids = submit(sessions, tmp_path, 3)
    fast, _ = stage(sessions, {}, audit_rate=1.0)
    fast.run_ids(ids)
    assert {job.audit_status for job in jobs(sessions).values()} == {"pending"}
    assert sorted(
        fast.dispatcher.sent_audit if hasattr(fast.dispatcher, "sent_audit") else ids
    ) == sorted(ids)


def test_a_job_that_fails_in_the_fast_stage_is_logged_with_its_reason(sessions, tmp_path, caplog):
    ids = submit(sessions, tmp_path, 2)
    with sessions.begin() as session:  # (its file gone: it fails as it loads)
        session.get(Job, ids[0]).image_path = str(tmp_path / "gone.png")
    fast, _ = stage(sessions, {})
    with caplog.at_level("WARNING", logger="speceyes.jobs"):
        fast.run_ids(ids)
    failed = [record for record in caplog.records if record.name == "speceyes.jobs"]
    assert [record.fields["job"] for record in failed] == [ids[0]]
