"""Dispatching: what a transaction wrote is sent once it has committed (never if it
failed), to every queue, in priority classes where the dispatcher orders its messages;
a send that fails after the commit is handed on or raised."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from common.contracts import Queue
from common.errors import BackendUnavailable
from common.pipeline import dispatch
from common.store import submission
from common.store.tables import Job
from tests.helpers.store import items, new_batch


class _Watching(dispatch.StoreOnly):
    """Sends nothing, but looks, at the moment of each send, at what another connection
    to the store sees of the jobs sent: a worker elsewhere sees only what is committed."""

    def __init__(self, sessions) -> None:
        super().__init__()
        self.sessions = sessions
        self.seen: list[list[str | None]] = []

    def send_fast(self, job_ids, **kwargs) -> int:
        ids = list(job_ids)
        with self.sessions() as elsewhere:  # (a connection of its own)
            found = {
                job.id: job.status for job in elsewhere.scalars(select(Job).where(Job.id.in_(ids)))
            }
        self.seen.append([found.get(job_id) for job_id in ids])
        return super().send_fast(ids, **kwargs)


def test_jobs_are_sent_only_once_their_transaction_has_committed(sessions):
    dispatcher = _Watching(sessions)
    with dispatcher.transaction(sessions) as tx:
        made: list[tuple[str, str]] = []
        submission.submit_items(
            tx.session, new_batch(tx.session), items("a", "b"), "c", created_jobs=made
        )
        tx.to_fast(job_id for job_id, _ in made)
    assert dispatcher.seen == [["queued", "queued"]]  # committed before the send
    with pytest.raises(RuntimeError), dispatcher.transaction(sessions) as tx:
        made = []
        submission.submit_items(
            tx.session, new_batch(tx.session, "k2"), items("c"), "c", created_jobs=made
        )
        tx.to_fast(job_id for job_id, _ in made)
        raise RuntimeError("the transaction fails")
    assert len(dispatcher.seen) == 1  # rolled back: nothing sent


class _Recording(dispatch.Dispatcher):
    """Records each delivery: the queue, the ids and how."""

    orders_messages = True

    def __init__(self, fail: bool = False) -> None:
        self.deliveries: list[tuple[str, list[str], int]] = []
        self.hows: list[dispatch.Delivery] = []
        self.fail = fail

    def deliver(self, queue, job_ids, how) -> int:
        if self.fail:
            raise BackendUnavailable("the broker is down")
        self.deliveries.append((queue, job_ids, how.priority))
        self.hows.append(how)
        return len(job_ids)


def _jobs(sessions, *ranks: int) -> list[str]:
    """New queued jobs at these priority ranks, committed."""
    with sessions.begin() as session:
        made: list[tuple[str, str]] = []
        names = [f"job-{i}" for i in range(len(ranks))]
        batch = new_batch(session, f"k-{len(ranks)}-{ranks}")
        submission.submit_items(session, batch, items(*names), "c", created_jobs=made)
        ids = [job_id for job_id, _ in made]
        for job_id, rank in zip(ids, ranks, strict=True):
            session.get(Job, job_id).priority = rank
        return ids


def test_every_queue_is_sent_to_and_each_priority_class_apart_the_most_urgent_first(sessions):
    low, normal, high, other_normal = _jobs(sessions, 2, 1, 0, 1)
    dispatcher = _Recording()
    with dispatcher.transaction(sessions) as tx:
        tx.to_fast([low, normal, high])
        tx.to_slow([other_normal])
        tx.to_audit(["audit-me"])
    assert dispatcher.deliveries == [
        ("fast", [high], 0),
        ("fast", [normal], 1),
        ("fast", [low], 2),
        ("slow", [other_normal], 1),
        ("audit", ["audit-me"], 1),
    ]
    # a plain send is no takeover, no retry, packed, and not held back
    assert {(how.takeover, how.retries, how.one_each, how.delay_s) for how in dispatcher.hows} == {
        (False, 0, False, None)
    }
    in_process = dispatch.StoreOnly()  # (claims in order itself: its sends carry no class)
    with in_process.transaction(sessions) as tx:
        tx.to_fast([low, high])
    assert in_process.sent_fast == [low, high]


def test_jobs_sent_again_keep_their_priorities_and_go_at_normal_without_a_store(sessions):
    """A hand-back, a retry or a re-send (``send_again``) sends each job at its own
    priority, with the options given; with the store gone, at normal, still sent."""
    low, high, normal = _jobs(sessions, 2, 0, 1)
    dispatcher = _Recording()
    sent = dispatcher.send_again(
        sessions, Queue.SLOW, [low, normal, high], takeover=True, one_each=True, retries=2
    )
    assert sent == 3
    assert dispatcher.deliveries == [("slow", [high], 0), ("slow", [normal], 1), ("slow", [low], 2)]
    assert {(how.takeover, how.one_each, how.retries) for how in dispatcher.hows} == {
        (True, True, 2)
    }

    def gone():
        raise OperationalError("select", {}, Exception("the database is down"))

    dispatcher = _Recording()
    assert dispatcher.send_again(gone, Queue.FAST, [low, high], delay_s=1.0) == 2
    assert dispatcher.deliveries == [("fast", [low, high], 1)]


def test_a_send_that_fails_after_the_commit_is_handed_on_or_raised(sessions):
    (job,) = _jobs(sessions, 1)
    handed: list[Exception] = []
    with _Recording(fail=True).transaction(sessions, on_send_error=handed.append) as tx:
        tx.to_slow([job])
    assert [type(exc) for exc in handed] == [BackendUnavailable]
    with pytest.raises(BackendUnavailable), _Recording(fail=True).transaction(sessions) as tx:
        tx.to_fast([job])
    with sessions() as session:  # committed either way: the reconciler sends it later
        assert session.get(Job, job) is not None


def test_an_in_process_dispatcher_delivers_no_audit(sessions):
    assert dispatch.StoreOnly().send_audit(["a"]) == 0


def test_a_dispatcher_that_does_not_order_messages_sends_again_without_the_store():
    """The in-process runner claims in priority order itself: sending again reads nothing
    (the store may be why the jobs are sent again)."""

    def untouchable():
        raise AssertionError("the store was read")

    in_process = dispatch.StoreOnly()
    assert in_process.send_again(untouchable, Queue.FAST, ["a", "b"]) == 2
    assert in_process.sent_fast == ["a", "b"]


def test_a_transaction_says_how_long_its_sends_took(sessions):
    (job,) = _jobs(sessions, 1)
    with _Recording().transaction(sessions) as tx:
        tx.to_fast([job])
    assert 0.0 <= tx.sent_s < 60.0


def test_a_dispatcher_must_say_how_it_delivers():
    class Silent(dispatch.Dispatcher):
        pass

    with pytest.raises(TypeError, match="deliver"):
        Silent()  # type: ignore[abstract]
