"""What a job's view says about the gate."""

from __future__ import annotations

from datetime import UTC, datetime

from api.schemas import JobView
from common.store.tables import Job


def _job(**fields) -> Job:
    now = datetime.now(UTC)
    return Job(
        id="j", question="Q?", status="done", stage="agent", attempts=1, created_at=now, **fields
    )


def test_an_agents_answer_carries_no_confidence_but_shows_the_gates_decision():
    deferred = {"confidence": 0.41, "gate": {"threshold": 0.98}, "small_answer": "B"}
    view = JobView.of(_job(answered_by="large", final_answer="A", **deferred))
    assert view.confidence is None
    assert view.gate is not None
    assert (view.gate.confidence, view.gate.threshold, view.gate.accepted) == (0.41, 0.98, False)


def test_an_accepted_answer_has_the_gates_confidence():
    accepted = {"confidence": 0.99, "gate": {"threshold": 0.98}, "small_answer": "A"}
    view = JobView.of(_job(answered_by="small", final_answer="A", **accepted))
    assert view.confidence == 0.99 and view.gate is not None and view.gate.accepted


def test_a_job_the_small_model_never_saw_has_no_gate():
    view = JobView.of(_job(answered_by="large", final_answer="A", screen_needs_tools=True))
    assert view.confidence is None and view.gate is None


def test_every_time_leaves_in_utc_with_its_zone(sessions):
    """A job's and a batch's times, as the API, the export and the command line's JSON
    write them, end in Z on SQLite (which stores none) and PostgreSQL alike."""
    from common.store import submission
    from common.store.export import result_row
    from common.store.tables import Batch, BatchItem, iso_utc
    from tests.helpers.store import items, new_batch

    with sessions.begin() as session:
        batch = new_batch(session)
        submission.submit_items(session, batch, items("a"), "cfg")
    with sessions.begin() as session:
        job = session.query(Job).one()
        job.reviewed_at, job.reviewer, job.reviewed_answer = datetime.now(UTC), "me", "x"
    with sessions() as session:  # read back
        job, batch = session.query(Job).one(), session.query(Batch).one()
        item = session.query(BatchItem).one()
        written = [
            JobView.of(job).model_dump(mode="json")["timings"]["created_at"],
            JobView.of(job).model_dump(mode="json")["reviewed_at"],
            result_row(item, job)["reviewed_at"],
            iso_utc(batch.created_at),
        ]
    assert all(moment.endswith("Z") for moment in written), written
    assert job.created_at.utcoffset().total_seconds() == 0
