"""The job store on SQLite and PostgreSQL, schema built by the migrations."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, select

from common.agents.deepeyes import Trajectory
from common.backends.base import ScreenResult
from common.config import GateSettings
from common.funnel import Accepted, AgentOutcome, Deferred, Failed
from common.store import jobs as store
from common.store.db import downgrade, make_engine, migrate
from common.store.tables import Batch, BatchItem, Job

GATE = GateSettings()


def new_batch(session, key: str = "k") -> Batch:
    batch, _ = store.get_or_create_batch(session, key=key, name="b", source="src", config={})
    return batch


def items(*names: str, question: str = "Q?") -> list[store.NewItem]:
    return [
        store.NewItem(i, name, question, ["a", "b"], f"/img/{name}.png", image_hash=f"hash-{name}")
        for i, name in enumerate(names)
    ]


def test_the_migrations_build_and_remove_the_schema(database_url):
    engine = make_engine(database_url)
    migrate(engine)
    assert {"jobs", "batches", "batch_items", "alembic_version"} <= set(
        inspect(engine).get_table_names()
    )
    downgrade(engine)
    assert "jobs" not in inspect(engine).get_table_names()
    migrate(engine)  # and back up again
    assert "jobs" in inspect(engine).get_table_names()
    engine.dispose()


def test_submitting_twice_makes_each_job_once(sessions):
    with sessions.begin() as session:
        batch = new_batch(session)
        assert store.submit_items(session, batch, items("x", "y", "z"), "cfg") == (3, 3)
    with sessions.begin() as session:
        batch = new_batch(session)  # found, not created
        assert store.submit_items(session, batch, items("x", "y", "z"), "cfg") == (0, 0)
    with sessions() as session:
        assert session.query(Job).count() == 3 and session.query(BatchItem).count() == 3
        assert session.query(Batch).count() == 1


def test_the_same_request_in_two_batches_is_one_job(sessions):
    with sessions.begin() as session:
        first, second = new_batch(session, "one"), new_batch(session, "two")
        store.submit_items(session, first, items("x"), "cfg")
        assert store.submit_items(session, second, items("x"), "cfg") == (0, 1)
        other_config = new_batch(session, "three")
        assert store.submit_items(session, other_config, items("x"), "other-cfg") == (1, 1)


def test_a_broken_item_is_a_failed_job_with_its_reason(sessions):
    broken = store.NewItem(
        0, "row-3", "", error=("invalid_input", "m.jsonl line 3: missing question")
    )
    with sessions.begin() as session:
        store.submit_items(session, new_batch(session), [broken], "cfg")
    with sessions() as session:
        job = session.scalars(select(Job)).one()
        assert (job.status, job.error_code) == ("failed", "invalid_input")
        assert job.error_message == "m.jsonl line 3: missing question"


def claim_all(sessions, status: str = "queued") -> list[store.Ticket]:
    with sessions.begin() as session:
        return store.claim(session, status, 100)


def test_recording_an_outcome_twice_leaves_one_result(sessions):
    with sessions.begin() as session:
        store.submit_items(session, new_batch(session), items("x", "y"), "cfg")
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
        assert store.record_fast(session, first, GATE) == 2
    with sessions.begin() as session:
        assert store.record_fast(session, again, GATE) == 0  # a redelivery changes nothing
    with sessions() as session:
        done, deferred = session.get(Job, x.job_id), session.get(Job, y.job_id)
        assert (done.status, done.final_answer, done.answered_by) == ("done", "A", "small")
        assert done.gate == {"mode": "min", "top_k": 64, "threshold": 0.98}
        assert (deferred.status, deferred.defer_reason, deferred.small_answer) == (
            "deferred",
            "low_confidence",
            "B",
        )
    (ticket,) = claim_all(sessions, "deferred")
    outcome = AgentOutcome(ticket.job_id, "C", Trajectory(answer="C"))
    with sessions.begin() as session:
        assert store.record_agent(session, outcome)
    with sessions.begin() as session:
        assert not store.record_agent(session, AgentOutcome(ticket.job_id, "D", Trajectory()))
    with sessions() as session:
        job = session.get(Job, ticket.job_id)
        assert (job.status, job.final_answer, job.answered_by) == ("done", "C", "large")
        assert job.trajectory["answer"] == "C"


def test_interrupted_jobs_go_back_to_their_stage(sessions):
    with sessions.begin() as session:
        batch = new_batch(session)
        store.submit_items(session, batch, items("x", "y", "z"), "cfg")
        batch_id = batch.id
    x, y, z = claim_all(sessions)
    with sessions.begin() as session:
        store.record_fast(session, [Deferred(y.job_id, "tools_needed")], GATE)
    claim_all(sessions, "deferred")  # y is running in the agent stage now
    with sessions.begin() as session:
        assert store.release_running(session, batch_id) == 3
    with sessions() as session:
        statuses = {job.id: job.status for job in session.scalars(select(Job))}
        assert statuses == {x.job_id: "queued", y.job_id: "deferred", z.job_id: "queued"}
        assert session.get(Job, y.job_id).attempts == 1  # attempts count per stage


def test_counts_give_beta_and_alpha(sessions):
    with sessions.begin() as session:
        batch = new_batch(session)
        store.submit_items(session, batch, items("a", "b", "c", "d", "e"), "cfg")
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
        store.record_fast(session, outcomes, GATE)
    with sessions() as session:
        counts = store.batch_counts(session, batch_id)
    assert counts.jobs == counts.items == 5
    assert counts.by_status == {"done": 1, "deferred": 3, "failed": 1}
    assert counts.beta == pytest.approx(2 / 4) and counts.alpha == pytest.approx(1 / 2)
    assert counts.failures == {"image_error": 1}
