"""Cancelling and taking work up again, row by row (``common.store.cancels``), on SQLite
and PostgreSQL: nothing finished is lost, a running job stops at the end of its step,
and nothing cancelled is ever handed out again."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select, text

from common.agents.trajectory import Trajectory
from common.config import GateSettings
from common.contracts import (
    Accepted,
    AgentOutcome,
    CancelReason,
    Deferred,
    Failed,
    ScreenResult,
    Stage,
)
from common.pipeline.cancel import cancel_batch
from common.store import audits, cancels, claims, reads, submission
from common.store.reads import batch_jobs
from common.store.tables import Batch, Job
from tests.helpers.store import items, new_batch
from tests.helpers.waiting import wait_until

GATE = GateSettings()
SCREEN = ScreenResult(False, "no")


def _batch(sessions, *names: str) -> str:
    with sessions.begin() as session:
        batch = new_batch(session)
        submission.submit_items(session, batch, items(*names), "cfg")
        return batch.id


def _claim(sessions, stage: Stage, limit: int = 100):
    with sessions.begin() as session:
        return claims.claim(session, stage, limit)


def _statuses(sessions) -> dict[str, tuple[str, str | None]]:
    with sessions() as session:
        return {job.id: (job.status, job.error_code) for job in session.scalars(select(Job))}


def test_a_cancel_ends_what_waits_marks_what_runs_and_keeps_what_finished(sessions):
    batch_id = _batch(sessions, "done", "running", "queued", "deferred")
    done, running, deferred = _claim(sessions, Stage.FAST, 3)
    with sessions.begin() as session:
        claims.record_fast(session, [Accepted(done.job_id, "A", 0.99, [9.0], SCREEN)], GATE)
        claims.record_fast(session, [Deferred(deferred.job_id, "tools_needed")], GATE)
        queued = reads.job_ids(session, batch_id, "queued")[0]
        first = cancels.cancel(session, batch_jobs(batch_id), CancelReason.CANCELLED)
    assert (first.cancelled, first.stopping, first.finished) == (2, 1, 1)
    assert _statuses(sessions) == {
        done.job_id: ("done", None),
        running.job_id: ("running", None),
        queued: ("cancelled", "cancelled"),
        deferred.job_id: ("cancelled", "cancelled"),
    }
    with sessions.begin() as session:
        again = cancels.cancel(session, batch_jobs(batch_id), CancelReason.CANCELLED)
        assert session.get(Job, running.job_id).cancel_requested == "cancelled"
    assert (again.cancelled, again.stopping, again.finished) == (0, 1, 3)
    assert _claim(sessions, Stage.FAST) == [] and _claim(sessions, Stage.AGENT) == []
    with sessions() as session:
        assert reads.waiting_jobs(session) == {Stage.FAST: [], Stage.AGENT: []}
        counts = reads.batch_counts(session, batch_id)
    assert (counts.finished, counts.cancellations) == (3, {"cancelled": 2})


def test_a_marked_micro_batch_keeps_its_accepted_answer_and_goes_no_further(sessions):
    _batch(sessions, "accepted", "deferred")
    accepted, deferred = _claim(sessions, Stage.FAST)
    with sessions.begin() as session:
        cancels.cancel(session, [accepted.job_id, deferred.job_id], CancelReason.CANCELLED)
    outcomes = [
        Accepted(accepted.job_id, "A", 0.99, [9.0], SCREEN),
        Deferred(deferred.job_id, "low_confidence", SCREEN, "B", 0.5),
    ]
    with sessions.begin() as session:
        claims.record_fast(session, outcomes, GATE)
    assert _statuses(sessions) == {
        accepted.job_id: ("done", None),
        deferred.job_id: ("cancelled", "cancelled"),
    }
    with sessions() as session:
        kept = session.get(Job, deferred.job_id)
        assert (kept.small_answer, kept.cancel_requested) == ("B", None)  # what it did is kept
        assert session.get(Job, accepted.job_id).cancel_requested is None  # the mark is gone
    assert _claim(sessions, Stage.AGENT) == []


def test_a_marked_job_put_back_to_wait_is_cancelled_instead(sessions):
    """A release (a retry, an interrupt) or a dead worker's job taken back: none of them
    hands a cancelled job out again, and the reconciler is told of none to re-send."""
    _batch(sessions, "released", "orphan", "interrupted")
    released, orphan, interrupted = _claim(sessions, Stage.FAST)
    with sessions.begin() as session:
        session.get(Job, orphan.job_id).worker = "fast@gone:1"
        cancels.cancel(
            session, [released.job_id, orphan.job_id, interrupted.job_id], CancelReason.CANCELLED
        )
    with sessions.begin() as session:
        claims.release_ids(session, [released.job_id], Stage.FAST, count_attempt=False)
        assert claims.release_orphans(session, {"fast@alive:2"}) == {
            Stage.FAST: [],
            Stage.AGENT: [],
        }
        claims.release_running(session)
    assert {status for status, _ in _statuses(sessions).values()} == {"cancelled"}


def test_a_trajectory_stopped_between_steps_is_cancelled_and_a_late_record_changes_nothing(
    sessions,
):
    _batch(sessions, "x")
    (ticket,) = _claim(sessions, Stage.FAST)
    with sessions.begin() as session:
        claims.record_fast(session, [Deferred(ticket.job_id, "tools_needed")], GATE)
    _claim(sessions, Stage.AGENT)
    with sessions.begin() as session:
        assert not cancels.requested(session, ticket.job_id)
        cancels.cancel(session, [ticket.job_id], CancelReason.CANCELLED)
        assert cancels.requested(session, ticket.job_id)
        assert cancels.stop_running(session, ticket.job_id, Stage.AGENT)
    with sessions.begin() as session:
        late = AgentOutcome(ticket.job_id, "C", Trajectory(answer="C"))
        assert not claims.record_agent(session, late)
    assert _statuses(sessions) == {ticket.job_id: ("cancelled", "cancelled")}


def test_a_cancel_withdraws_pending_audits_and_only_those(sessions):
    batch_id = _batch(sessions, "pending", "running")
    tickets = _claim(sessions, Stage.FAST)
    with sessions.begin() as session:
        accepted = [Accepted(t.job_id, "A", 0.99, [9.0], SCREEN) for t in tickets]
        claims.record_fast(session, accepted, GATE)
        audits.request(session, [t.job_id for t in tickets])
        (auditing,) = audits.claim(session, [tickets[1].job_id])
        cancels.cancel(session, batch_jobs(batch_id), CancelReason.CANCELLED)
    with sessions() as session:
        states = {job.id: job.audit_status for job in session.scalars(select(Job))}
    assert states == {tickets[0].job_id: "cancelled", auditing.job_id: "running"}


def test_requeue_takes_cancelled_or_failed_jobs_back_to_the_stage_they_stopped_in(sessions):
    batch_id = _batch(sessions, "fast", "agent", "done")
    fast, agent, done = _claim(sessions, Stage.FAST)
    with sessions.begin() as session:
        claims.record_fast(
            session,
            [
                Deferred(agent.job_id, "tools_needed"),
                Accepted(done.job_id, "A", 1.0, [9.0], SCREEN),
            ],
            GATE,
        )
        claims.release_ids(session, [fast.job_id], Stage.FAST, count_attempt=True)
        cancels.cancel(session, batch_jobs(batch_id), CancelReason.FAILURE_BUDGET)
    assert _statuses(sessions)[fast.job_id] == ("cancelled", "failure_budget")
    with sessions.begin() as session:
        failed_only = cancels.requeue(session, batch_jobs(batch_id), ["failed"])
        both = cancels.requeue(session, batch_jobs(batch_id), ["cancelled"])
    assert failed_only == [] and sorted(both) == sorted([fast.job_id, agent.job_id])
    with sessions() as session:
        jobs = {job.id: job for job in session.scalars(select(Job))}
    assert (jobs[fast.job_id].status, jobs[fast.job_id].attempts) == ("queued", 0)
    assert (jobs[agent.job_id].status, jobs[agent.job_id].defer_reason) == (
        "deferred",
        "tools_needed",
    )
    assert jobs[agent.job_id].error_code is None and jobs[agent.job_id].finished_at is None
    assert (jobs[done.job_id].status, jobs[done.job_id].final_answer) == ("done", "A")


def test_requeue_of_one_code_leaves_the_others(sessions):
    batch_id = _batch(sessions, "a", "b")
    a, b = _claim(sessions, Stage.FAST)
    with sessions.begin() as session:
        claims.fail_running(session, a.job_id, Stage.FAST, "image_missing", "gone")
        claims.fail_running(session, b.job_id, Stage.FAST, "model_error", "boom")
        assert cancels.requeue(session, batch_jobs(batch_id), ["failed"], "model_error") == [
            b.job_id
        ]
    assert _statuses(sessions) == {
        a.job_id: ("failed", "image_missing"),
        b.job_id: ("queued", None),
    }


def test_failures_recorded_past_a_batchs_budget_cancel_the_rest(sessions):
    """The workers' path: failures recorded by a stage, counted once enough finished."""
    batch_id = _batch(sessions, "a", "b", "c", "d", "e")
    with sessions.begin() as session:
        batch = session.get(Batch, batch_id)
        batch.max_failure_rate, batch.budget_after = 0.4, 2
    a, b, c = _claim(sessions, Stage.FAST, 3)
    with sessions.begin() as session:  # 1 of 1 finished failed: under the count of 2
        claims.record_fast(session, [Failed(a.job_id, "model_error", "x")], GATE)
    assert {status for status, _ in _statuses(sessions).values()} == {"failed", "running", "queued"}
    with sessions.begin() as session:  # 2 of 2: over 40%, the rest stops
        claims.fail_running(session, b.job_id, Stage.FAST, "model_error", "y")
    statuses = _statuses(sessions)
    assert sorted(status for status, _ in statuses.values()) == [
        "cancelled",
        "cancelled",
        "failed",
        "failed",
        "running",  # (its micro-batch finishes; a deferral would cancel it)
    ]
    with sessions() as session:
        assert session.get(Batch, batch_id).stopped.startswith("failure_budget: 2 of 2")
        assert session.get(Job, c.job_id).cancel_requested == "failure_budget"


def test_a_cancel_of_one_batch_leaves_a_job_another_batch_shares(sessions):
    with sessions.begin() as session:
        first, second = new_batch(session, "first"), new_batch(session, "second")
        submission.submit_items(session, first, items("shared", "own"), "cfg")
        submission.submit_items(session, second, items("shared"), "cfg")
        first_id, second_id = first.id, second.id
    with sessions.begin() as session:
        done = cancel_batch(session, first_id)
    assert (done.cancelled, done.stopping) == (1, 0)
    with sessions() as session:
        assert reads.batch_counts(session, second_id).by_status == {"queued": 1}
        assert reads.batch_counts(session, first_id).by_status == {"queued": 1, "cancelled": 1}


def test_a_resume_takes_back_the_mark_on_a_job_still_running(sessions):
    batch_id = _batch(sessions, "running", "waiting")
    (running,) = _claim(sessions, Stage.FAST, 1)
    with sessions.begin() as session:
        cancels.cancel(session, batch_jobs(batch_id), CancelReason.CANCELLED)
        cancels.requeue(session, batch_jobs(batch_id), ["cancelled"])
        claims.record_fast(session, [Deferred(running.job_id, "tools_needed")], GATE)
    statuses = _statuses(sessions)
    assert statuses[running.job_id] == ("deferred", None)  # goes on, as if never cancelled
    assert sorted(status for status, _ in statuses.values()) == ["deferred", "queued"]


def test_a_budget_is_checked_when_a_success_brings_the_count_to_it(sessions):
    batch_id = _batch(sessions, "a", "b", "c", "d", "e")
    with sessions.begin() as session:
        batch = session.get(Batch, batch_id)
        batch.max_failure_rate, batch.budget_after = 0.2, 4
    a, b, c, d = _claim(sessions, Stage.FAST, 4)
    with sessions.begin() as session:
        failures = [Failed(a.job_id, "model_error", "x"), Failed(b.job_id, "model_error", "y")]
        claims.record_fast(session, failures, GATE)
        claims.record_fast(session, [Accepted(c.job_id, "A", 0.99, [9.0], SCREEN)], GATE)
    assert _statuses(sessions)[d.job_id][0] == "running"  # 3 finished: under the count
    with sessions.begin() as session:  # 2 of 4 failed, over 20%: the rest stops
        claims.record_fast(session, [Accepted(d.job_id, "A", 0.99, [9.0], SCREEN)], GATE)
    assert sorted(status for status, _ in _statuses(sessions).values()) == [
        "cancelled",
        "done",
        "done",
        "failed",
        "failed",
    ]


def test_a_cancel_waits_for_a_deferral_being_committed_and_catches_it(sessions, database_url):
    """PostgreSQL: a worker's deferral is written, not yet committed, when a cancel
    starts. The cancel waits for the row and cancels it as the worker left it."""
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite runs one writer at a time: no such interleaving")
    batch_id = _batch(sessions, "a")
    (ticket,) = _claim(sessions, Stage.FAST)
    worker = sessions()
    worker.begin()
    claims.record_fast(worker, [Deferred(ticket.job_id, "low_confidence")], GATE)
    done: dict[str, object] = {}

    def cancel_it() -> None:
        with sessions.begin() as session:
            done["result"] = cancel_batch(session, batch_id)

    thread = threading.Thread(target=cancel_it)
    thread.start()
    try:
        wait_until(lambda: _waiting_on_a_lock(sessions), deadline_s=30, what="the cancel to wait")
    finally:
        worker.commit()
        worker.close()
        thread.join(timeout=30)
    assert _statuses(sessions) == {ticket.job_id: ("cancelled", "cancelled")}
    assert done["result"].cancelled == 1


def _waiting_on_a_lock(sessions) -> bool:
    with sessions() as session:
        query = "select count(*) from pg_stat_activity where wait_event_type = 'Lock'"
        return bool(session.execute(text(query)).scalar())
