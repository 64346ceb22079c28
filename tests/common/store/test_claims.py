"""The job state machine (claims, records) and the read models, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import event, select, text

from common.agents.deepeyes import Trajectory
from common.config import GateSettings
from common.contracts import Accepted, AgentOutcome, Deferred, Failed, ScreenResult, Stage, Ticket
from common.store import analytics, claims, reads, submission
from common.store.tables import Job
from tests.helpers.store import items, new_batch

GATE = GateSettings()


def claim_all(sessions, stage: Stage = Stage.FAST) -> list[Ticket]:
    with sessions.begin() as session:
        return claims.claim(session, stage, 100)


def test_recording_an_outcome_twice_leaves_one_result(sessions):
    with sessions.begin() as session:
        submission.submit_items(session, new_batch(session), items("x", "y"), "cfg")
    x, y = claim_all(sessions)
    screen = ScreenResult(False, "no")
    first = [
        Accepted(x.job_id, "A", 0.99, [7.0], screen),
        Deferred(y.job_id, "low_confidence", screen, "B", 0.5),
    ]
    again = [
        Accepted(x.job_id, "CHANGED", 0.999, [9.0], screen),
        Accepted(y.job_id, "B", 0.99, [8.0], screen),
    ]
    with sessions.begin() as session:
        assert claims.record_fast(session, first, GATE) == 2
    with sessions.begin() as session:
        assert claims.record_fast(session, again, GATE) == 0  # a redelivery changes nothing
    with sessions() as session:
        done, deferred = session.get(Job, x.job_id), session.get(Job, y.job_id)
        assert (done.status, done.final_answer, done.answered_by) == ("done", "A", "small")
        assert done.gate == {"mode": "min", "top_k": 64, "threshold": 0.98}
        assert (deferred.status, deferred.defer_reason, deferred.small_answer) == (
            "deferred",
            "low_confidence",
            "B",
        )
    (ticket,) = claim_all(sessions, Stage.AGENT)
    outcome = AgentOutcome(ticket.job_id, "C", Trajectory(answer="C"))
    with sessions.begin() as session:
        assert claims.record_agent(session, outcome)
    with sessions.begin() as session:
        assert not claims.record_agent(session, AgentOutcome(ticket.job_id, "D", Trajectory()))
    with sessions() as session:
        job = session.get(Job, ticket.job_id)
        assert (job.status, job.final_answer, job.answered_by) == ("done", "C", "large")
        assert job.trajectory["answer"] == "C"


def test_interrupted_jobs_go_back_to_their_stage(sessions):
    with sessions.begin() as session:
        batch = new_batch(session)
        submission.submit_items(session, batch, items("x", "y", "z"), "cfg")
        batch_id = batch.id
    x, y, z = claim_all(sessions)
    with sessions.begin() as session:
        claims.record_fast(session, [Deferred(y.job_id, "tools_needed")], GATE)
    claim_all(sessions, Stage.AGENT)  # y is running in the agent stage now
    with sessions.begin() as session:
        assert claims.release_running(session, batch_id) == 3
    with sessions() as session:
        statuses = {job.id: job.status for job in session.scalars(select(Job))}
        assert statuses == {x.job_id: "queued", y.job_id: "deferred", z.job_id: "queued"}
        assert session.get(Job, y.job_id).attempts == 1  # attempts count per stage


def test_counts_give_beta_and_alpha(sessions):
    with sessions.begin() as session:
        batch = new_batch(session)
        submission.submit_items(session, batch, items("a", "b", "c", "d", "e"), "cfg")
        batch_id = batch.id
    a, b, c, d, e = claim_all(sessions)
    yes, no = ScreenResult(True, "yes"), ScreenResult(False, "no")
    outcomes = [
        Accepted(a.job_id, "A", 0.99, [7.0], no),
        Deferred(b.job_id, "low_confidence", no, "B", 0.5),
        Deferred(c.job_id, "tools_needed", yes),
        Deferred(d.job_id, "tools_needed", yes),
        Failed(e.job_id, "image_error", "corrupt"),
    ]
    with sessions.begin() as session:
        claims.record_fast(session, outcomes, GATE)
    with sessions() as session:
        counts = reads.batch_counts(session, batch_id)
    assert counts.jobs == counts.items == 5
    assert counts.by_status == {"done": 1, "deferred": 3, "failed": 1}
    assert counts.beta == pytest.approx(2 / 4) and counts.alpha == pytest.approx(1 / 2)
    assert counts.failures == {"image_error": 1}


def test_claims_count_attempts_and_an_interrupt_gives_them_back(sessions):
    with sessions.begin() as session:
        batch = new_batch(session)
        submission.submit_items(session, batch, items("x"), "cfg")
        batch_id = batch.id
    (first,) = claim_all(sessions)
    with sessions.begin() as session:  # a crash: the restart counts the attempt
        claims.release_running(session, batch_id)
    (second,) = claim_all(sessions)
    with sessions.begin() as session:  # Ctrl-C: not the job's doing
        claims.release_running(session, batch_id, count_attempt=False)
    (third,) = claim_all(sessions)
    assert (first.attempts, second.attempts, third.attempts) == (1, 2, 2)


def test_stage_busy_sums_each_fast_batch_once_and_measures_the_fill(sessions):
    from datetime import UTC, datetime, timedelta

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    with sessions.begin() as session:
        batch = new_batch(session)
        submission.submit_items(session, batch, items("a", "b", "c"), "cfg")
        batch_id = batch.id
    with sessions.begin() as session:
        a, b, c = session.scalars(select(Job).order_by(Job.idempotency_key)).all()
        for job in (a, b):  # one fast batch of two, 2 s
            job.fast_started_at, job.gated_at = t0, t0 + timedelta(seconds=2)
        c.fast_started_at, c.gated_at = t0 + timedelta(seconds=3), t0 + timedelta(seconds=4)
        b.agent_started_at, b.finished_at = t0 + timedelta(seconds=1), t0 + timedelta(seconds=6)
    with sessions() as session:
        busy = analytics.stage_busy(session, batch_id)
    assert (busy.fast_s, busy.fast_jobs) == (3.0, 3)
    assert (busy.agent_s, busy.agent_jobs, busy.fill_s) == (5.0, 1, 1.0)


def test_a_claim_by_ids_reads_its_jobs_by_primary_key_whatever_the_statistics(postgres_url):
    """A table loaded faster than autovacuum analyzes it is planned as if nearly empty;
    a claim must still find its jobs by id, never read every waiting job through the
    status index (it did: 15 ms a claim at 20,000 waiting)."""
    from common.store.db import open_store

    sessions = open_store(postgres_url)
    try:
        with sessions.begin() as session:
            batch = new_batch(session)
            many = [f"item-{n}" for n in range(20000)]
            submission.submit_items(session, batch, items(*many), "cfg")
        with sessions() as session:
            ids = list(session.scalars(select(Job.id).limit(32)))
        sent: list[tuple[str, object]] = []  # what the claim sends, as psycopg gets it

        def capture(conn, cursor, statement, parameters, context, executemany):
            sent.append((statement, parameters))

        event.listen(sessions.engine, "before_cursor_execute", capture)
        with sessions() as session:  # (rolled back: the plan is all this wants)
            claimed = claims.claim_ids(
                session, ids, Stage.FAST, stale_after_s=None, untried_only=True
            )
            assert len(claimed) == 32
            session.rollback()
        event.remove(sessions.engine, "before_cursor_execute", capture)
        (statement, parameters), *_ = [one for one in sent if "UPDATE jobs" in one[0]]
        with sessions.engine.connect() as connection:
            cursor = connection.connection.driver_connection.cursor()
            explained = cursor.execute("EXPLAIN " + statement, parameters).fetchall()
        plan = "\n".join(row[0] for row in explained)
        assert "jobs_pkey" in plan and "ix_jobs_status" not in plan, plan
    finally:
        sessions.close()


def test_claims_commit_without_waiting_for_the_disk_and_records_wait(postgres_url):
    """A lost claim only puts its job back to wait; a lost record would leave it running
    for good: claims' sessions commit asynchronously, every other one durably."""
    from sqlalchemy import text

    from common.store.db import autocommit, open_store

    sessions = open_store(postgres_url)
    try:
        show = text("SHOW synchronous_commit")
        with autocommit(sessions, durable=False).begin() as session:
            assert session.scalar(show) == "off"
        for durable in (autocommit(sessions), sessions):
            with durable.begin() as session:
                assert session.scalar(show) == "on"
    finally:
        sessions.close()


def test_releasing_a_batchs_running_jobs_leaves_other_batches_running(sessions):
    """An interrupted annotate puts back its own batch's jobs, never a server's others."""
    with sessions.begin() as session:
        mine, theirs = new_batch(session, "mine"), new_batch(session, "theirs")
        submission.submit_items(session, mine, items("a"), "cfg")
        submission.submit_items(session, theirs, items("b"), "other-cfg")
        mine_id = mine.id
    claim_all(sessions)
    with sessions.begin() as session:
        assert claims.release_running(session, mine_id) == 1
    with sessions() as session:
        statuses = sorted(session.scalars(select(Job.status)))
    assert statuses == ["queued", "running"]


def test_a_deferred_job_keeps_the_gate_only_where_the_gate_judged_it_and_its_detail(sessions):
    with sessions.begin() as session:
        submission.submit_items(session, new_batch(session), items("x", "y"), "cfg")
    x, y = claim_all(sessions)
    outcomes = [
        Deferred(x.job_id, "tools_needed", ScreenResult(True, "yes")),  # the screen's doing
        Deferred(y.job_id, "low_confidence", ScreenResult(False, "no"), "B", 0.5, "below tau"),
    ]
    with sessions.begin() as session:
        assert claims.record_fast(session, outcomes, GATE) == 2
    with sessions() as session:
        screened, gated = session.get(Job, x.job_id), session.get(Job, y.job_id)
    assert (screened.gate, screened.error_message) == (None, None)
    assert gated.gate == {"mode": "min", "top_k": 64, "threshold": 0.98}
    assert gated.error_message == "below tau"


def test_the_small_models_zoom_steps_are_kept_with_its_job_accepted_or_deferred(sessions):
    with sessions.begin() as session:
        submission.submit_items(session, new_batch(session), items("x", "y", "z"), "cfg")
    x, y, z = claim_all(sessions)
    zoomed = ({"index": 0, "box_original": [1, 2, 30, 40]}, {"index": 1, "text": "<answer>"})
    outcomes = [
        Accepted(x.job_id, "A", 0.99, [7.0], None, zoomed),
        Deferred(y.job_id, "depth_exhausted", None, detail="no answer", zoom_steps=zoomed[:1]),
        Accepted(z.job_id, "B", 0.99, [7.0], None),  # (depth 0: nothing to keep)
    ]
    with sessions.begin() as session:
        assert claims.record_fast(session, outcomes, GATE) == 3
    with sessions() as session:
        kept = [session.get(Job, ticket.job_id).zoom_steps for ticket in (x, y, z)]
    assert kept == [list(zoomed), list(zoomed[:1]), None]


def test_a_job_handed_back_is_taken_over_at_once_and_a_stale_age_of_zero_takes_any(sessions):
    with sessions.begin() as session:
        submission.submit_items(session, new_batch(session), items("x", "y"), "cfg")
    x, y = claim_all(sessions)  # (running since just now)
    with sessions.begin() as session:
        taken = claims.claim_ids(session, [x.job_id], Stage.FAST, stale_after_s=60, takeover=True)
        stale = claims.claim_ids(session, [y.job_id], Stage.FAST, stale_after_s=0)
    assert [t.job_id for t in taken] == [x.job_id] and [t.job_id for t in stale] == [y.job_id]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_claim_passes_over_jobs_another_claim_is_taking(sessions):
    """Two workers claiming at once never wait on each other's rows: the second takes
    what the first has not locked (FOR UPDATE SKIP LOCKED)."""
    with sessions.begin() as session:
        submission.submit_items(session, new_batch(session), items("x", "y"), "cfg")
    with sessions.begin() as first:
        held = claims.claim(first, Stage.FAST, 1)
        with sessions.begin() as second:
            second.execute(text("SET LOCAL lock_timeout = '2s'"))
            other = claims.claim(second, Stage.FAST, 1)
    assert len(held) == len(other) == 1 and held[0].job_id != other[0].job_id
