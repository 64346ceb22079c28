"""The reconciler over a real store (SQLite and PostgreSQL) and a broker stand-in that
says when the oldest message of each queue went out and which ids workers hold."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import update

from common.config import GateSettings, Settings
from common.contracts import Deferred, JobStatus, Queue, Stage
from common.pipeline.dispatch import Backlog, StoreOnly
from common.pipeline.reconcile import LEASE, Reconciler, Sweep
from common.store import claims, liveness, submission
from common.store.db import is_postgres
from common.store.tables import Job, Worker
from tests.helpers.store import items, new_batch


class Broker(StoreOnly):
    """Records sends (and stamps them, as a broker's dispatcher does); ``oldest``: the
    send time of the oldest message on each queue (None: empty)."""

    stamps_sends = True

    def __init__(self) -> None:
        super().__init__()
        self.oldest: dict[tuple[Queue, int | None], float | None] = {
            (Queue.FAST, 1): None,
            (Queue.SLOW, 1): None,
            (Queue.AUDIT, None): None,
        }
        self.held: set[str] = set()  # taken by workers, not acknowledged
        self.sent_audit: list[str] = []

    def deliver(self, queue, job_ids, how) -> int:
        if queue == Queue.AUDIT:
            self.sent_audit += job_ids
            return len(job_ids)
        return super().deliver(queue, job_ids, how)

    def backlog(self) -> Backlog:
        return Backlog(dict(self.oldest), set(self.held))


def sent_at(sessions, job_id: str) -> float:
    with sessions() as session:
        return session.get(Job, job_id).sent_at.timestamp()


def sent(sessions, job_id: str, at: float) -> None:
    """``job_id``'s last message went out at ``at``."""
    with sessions.begin() as session:
        when = datetime.fromtimestamp(at, UTC)
        session.execute(update(Job).where(Job.id == job_id).values(sent_at=when))


SETTINGS = Settings(worker_dead_after_s=5, reconcile_after_s=30, reconcile_interval_s=1)


def jobs(sessions, *names: str) -> list[str]:
    with sessions.begin() as session:
        submission.submit_items(session, new_batch(session), items(*names), "cfg")
    with sessions() as session:
        return sorted(session.scalars(Job.__table__.select().with_only_columns(Job.id)))


def _silent_for_a_minute(session, worker: str) -> None:
    """``worker`` last beat a minute ago: dead, at the settings here."""
    session.execute(
        update(Worker)
        .where(Worker.id == worker)
        .values(beat_at=Worker.beat_at - timedelta(seconds=60))
    )


def test_a_dead_workers_running_jobs_go_back_and_are_sent_a_live_ones_stay(sessions):
    a, b = jobs(sessions, "a", "b")
    with sessions.begin() as session:
        liveness.beat(session, "alive", "slow")
        liveness.beat(session, "dead", "slow")
        claims.claim_ids(session, [a], Stage.FAST, stale_after_s=None, worker="dead")
        claims.claim_ids(session, [b], Stage.FAST, stale_after_s=None, worker="alive")
        _silent_for_a_minute(session, "dead")
    broker = Broker()
    sweep = Reconciler(sessions, broker, SETTINGS, "alive").sweep()
    assert sweep.leader and sweep.released == 1
    assert broker.sent_fast == [a]
    with sessions() as session:
        assert session.get(Job, a).status == JobStatus.QUEUED
        assert session.get(Job, a).attempts == 1  # the dead worker's claim counts
        assert session.get(Job, b).status == JobStatus.RUNNING
        assert liveness.live_workers(session, 5) == {"alive"}  # the dead one forgotten


def test_a_dead_slow_workers_trajectory_goes_back_to_the_slow_queue_at_once(sessions):
    """The agent stage's orphans, like the fast stage's, in the sweep that finds the death
    (not ``reconcile_after_s`` later, as a stranded job would be)."""
    a, b = jobs(sessions, "a", "b")
    with sessions.begin() as session:
        liveness.beat(session, "dead", "slow")
        for job_id in (a, b):
            claims.claim_ids(session, [job_id], Stage.FAST, stale_after_s=None, worker="fast")
            claims.record_fast(session, [Deferred(job_id, "tools_needed")], GateSettings())
        claims.claim_ids(session, [a], Stage.AGENT, stale_after_s=None, worker="dead")
        _silent_for_a_minute(session, "dead")
    broker = Broker()
    broker.oldest[Queue.SLOW, 1] = sent_at(sessions, b)  # (b's message waits: a's is not)
    sweep = Reconciler(sessions, broker, SETTINGS, "me").sweep()
    assert sweep.released == 1 and broker.sent_slow == [a] and broker.sent_fast == []
    with sessions() as session:
        assert session.get(Job, a).status == JobStatus.DEFERRED


def test_a_waiting_job_on_an_empty_queue_is_sent_again_only_after_the_age(sessions):
    (a,) = jobs(sessions, "a")
    broker = Broker()
    clock = [time.time()]
    reconciler = Reconciler(sessions, broker, SETTINGS, "me", clock=lambda: clock[0])
    assert reconciler.sweep().resent == {} and broker.sent_fast == []  # (on its way)
    clock[0] += 25
    assert reconciler.sweep().resent == {} and broker.sent_fast == []  # not for long
    clock[0] += 10
    sweep = reconciler.sweep()
    assert sweep.resent == {Queue.FAST: 1} and broker.sent_fast == [a]
    assert sent_at(sessions, a) >= clock[0] - 36  # stamped as it went out again
    broker.oldest[Queue.FAST, 1] = sent_at(sessions, a)  # its message is there now
    clock[0] += 60
    assert reconciler.sweep().resent == {} and broker.sent_fast == [a]


def test_a_job_sent_before_the_oldest_message_of_its_queue_is_gone(sessions):
    """FIFO: b's message is the oldest on the queue, a's went out a minute before it, so
    a's is not there (taken or lost) and is sent again at once; b waits its turn."""
    a, b = jobs(sessions, "a", "b")
    broker = Broker()
    broker.oldest[Queue.FAST, 1] = sent_at(sessions, b)
    sent(sessions, a, sent_at(sessions, b) - 60)
    sweep = Reconciler(sessions, broker, SETTINGS, "me").sweep()
    assert sweep.resent == {Queue.FAST: 1} and broker.sent_fast == [a]


def test_each_priority_is_measured_against_its_own_queue(sessions):
    """A high job lost while normal ones wait for hours is found at once: its list is
    empty, whatever the normal list's oldest message."""
    a, b = jobs(sessions, "a", "b")
    with sessions.begin() as session:
        session.execute(update(Job).where(Job.id == a).values(priority=0))
    broker = Broker()
    long_ago = time.time() - 3600
    broker.oldest[Queue.FAST, 1] = long_ago  # normal jobs from an hour ago still wait
    broker.oldest[Queue.FAST, 0] = None
    sent(sessions, a, time.time() - 60)
    sent(sessions, b, time.time() - 60)
    sweep = Reconciler(sessions, broker, SETTINGS, "me").sweep()
    assert sweep.resent == {Queue.FAST: 1} and broker.sent_fast == [a]


def test_a_sweep_sends_at_most_a_slice_the_longest_gone_first(sessions):
    ids = jobs(sessions, *"abcde")
    start = time.time() - 600
    for n, job_id in enumerate(ids):
        sent(sessions, job_id, start + n)
    settings = Settings(reconcile_after_s=30, reconcile_slice=2)
    broker = Broker()
    reconciler = Reconciler(sessions, broker, settings, "me")
    assert reconciler.sweep().resent == {Queue.FAST: 2} and broker.sent_fast == ids[:2]
    assert reconciler.sweep().resent == {Queue.FAST: 2} and broker.sent_fast == ids[:4]
    assert reconciler.sweep().resent == {Queue.FAST: 1} and broker.sent_fast == ids


def test_held_messages_do_not_take_a_slices_room(sessions):
    ids = jobs(sessions, *"abc")
    start = time.time() - 600
    for n, job_id in enumerate(ids):
        sent(sessions, job_id, start + n)
    broker = Broker()
    broker.held = {ids[0], ids[1]}  # the longest gone are held by live workers
    settings = Settings(reconcile_after_s=30, reconcile_slice=1)
    assert Reconciler(sessions, broker, settings, "me").sweep().resent == {Queue.FAST: 1}
    assert broker.sent_fast == [ids[2]]


def test_a_stranded_audit_goes_to_the_audit_queue_stamped(sessions):
    (a,) = jobs(sessions, "a")
    with sessions.begin() as session:
        session.execute(
            update(Job).where(Job.id == a).values(status=JobStatus.DONE, audit_status="pending")
        )
    sent(sessions, a, time.time() - 600)
    broker = Broker()
    assert Reconciler(sessions, broker, SETTINGS, "me").sweep().resent == {Queue.AUDIT: 1}
    assert broker.sent_audit == [a] and sent_at(sessions, a) > time.time() - 60


def test_a_dead_workers_running_audit_is_sent_once(sessions):
    (a,) = jobs(sessions, "a")
    with sessions.begin() as session:
        liveness.beat(session, "dead", "slow")
        session.execute(
            update(Job)
            .where(Job.id == a)
            .values(status=JobStatus.DONE, audit_status="running", worker="dead")
        )
        _silent_for_a_minute(session, "dead")
    broker = Broker()
    Reconciler(sessions, broker, SETTINGS, "me").sweep()
    assert broker.sent_audit == [a]  # (by the orphans' send, not again as stranded)


def test_a_row_from_before_send_times_counts_as_long_gone(sessions):
    """A job written without ``sent_at`` (by a version before it, during an upgrade)
    is overdue: sent again once, then stamped like any other."""
    a, b = jobs(sessions, "a", "b")
    with sessions.begin() as session:
        session.execute(update(Job).where(Job.id == a).values(sent_at=None))
    broker = Broker()
    broker.oldest[Queue.FAST, 1] = sent_at(sessions, b)  # (b's message waits)
    reconciler = Reconciler(sessions, broker, SETTINGS, "me")
    assert reconciler.sweep().resent == {Queue.FAST: 1} and broker.sent_fast == [a]
    assert reconciler.sweep().resent == {}  # (stamped: its new message is on its way)


def test_after_a_death_every_held_job_goes_at_once_whatever_the_slice(sessions):
    """A dead fast worker's prefetched messages stay "held" until the visibility timeout:
    in the sweep that finds the death each held job still waiting is sent again, even
    when the slice is full of older jobs (the dead one's are not the oldest here)."""
    ids = jobs(sessions, *"abcdef")
    start = time.time() - 600
    for n, job_id in enumerate(ids):
        sent(sessions, job_id, start + n)
    broker = Broker()
    broker.held = {ids[4], ids[5]}  # the youngest, held (by the dead worker, it will be)
    settings = Settings(worker_dead_after_s=5, reconcile_after_s=30, reconcile_slice=2)
    reconciler = Reconciler(sessions, broker, settings, "me")
    with sessions.begin() as session:
        liveness.beat(session, "fast-1", "fast")
        _silent_for_a_minute(session, "fast-1")
    sweep = reconciler.sweep()
    assert sweep.died == 1
    assert {ids[4], ids[5]} <= set(broker.sent_fast)  # the held ones, beyond the slice
    assert set(broker.sent_fast) == {ids[0], ids[1], ids[4], ids[5]}  # and the slice


def test_only_the_lease_holder_sweeps(sessions):
    jobs(sessions, "a")
    first, second = Broker(), Broker()
    settings = Settings(reconcile_after_s=0.0001, reconcile_interval_s=60)
    assert Reconciler(sessions, first, settings, "one").sweep().leader
    assert not Reconciler(sessions, second, settings, "two").sweep().leader
    with sessions.begin() as session:  # the holder went away: its lease lapses
        session.execute(
            update(liveness.Lease).values(expires_at=liveness.utcnow() - timedelta(seconds=1))
        )
    assert Reconciler(sessions, second, settings, "two").sweep().leader


def test_after_a_death_held_messages_are_not_trusted(sessions):
    """A worker killed between batches holds no running job, but holds messages it took
    and never started: they must not wait for the visibility timeout."""
    (a,) = jobs(sessions, "a")
    sent(sessions, a, time.time() - 600)  # taken off the queue long ago ...
    broker = Broker()
    broker.held = {a}  # ... by some worker, not acknowledged
    clock = [time.time()]
    reconciler = Reconciler(sessions, broker, SETTINGS, "me", clock=lambda: clock[0])
    assert reconciler.sweep().resent == {}  # trusted: a live worker may hold it
    with sessions.begin() as session:
        liveness.beat(session, "fast-1", "fast")
        session.execute(update(Worker).values(beat_at=Worker.beat_at - timedelta(seconds=60)))
    sweep = reconciler.sweep()
    # its held messages died with it: sent again at once, not reconcile_after_s later
    assert (sweep.died, sweep.released, sweep.resent) == (1, 0, {Queue.FAST: 1})
    assert broker.sent_fast == [a]
    clock[0] += 1  # (stamped as it went out again: not gone yet)
    assert reconciler.sweep().resent == {} and broker.sent_fast == [a]


def test_a_stranded_deferred_job_goes_to_the_slow_queue(sessions):
    a, b = jobs(sessions, "a", "b")
    with sessions.begin() as session:
        claims.claim_ids(session, [a], Stage.FAST, stale_after_s=None, worker="me")
        claims.record_fast(session, [Deferred(a, "tools_needed")], GateSettings())
    broker = Broker()
    clock = [time.time()]
    reconciler = Reconciler(sessions, broker, SETTINGS, "me", clock=lambda: clock[0])
    assert reconciler.sweep().resent == {}
    clock[0] += SETTINGS.recovery.reconcile_after_s + 1
    assert reconciler.sweep().resent == {Queue.SLOW: 1, Queue.FAST: 1}
    assert (broker.sent_slow, broker.sent_fast) == ([a], [b])


def test_after_a_broker_restart_every_job_without_a_message_is_sent_at_once(sessions):
    """A restart without persistence loses every message: waiting reconcile_after_s more
    would only delay the healing (a duplicate of a message that survived is harmless)."""
    a, b = jobs(sessions, "a", "b")
    broker = Broker()
    broker.oldest[Queue.FAST, 1] = sent_at(sessions, b)  # b's message survived
    sent(sessions, a, sent_at(sessions, b) - 1)  # a's went out a second before it
    clock = [time.time()]
    reconciler = Reconciler(sessions, broker, SETTINGS, "me", clock=lambda: clock[0])
    reconciler.broker_restarted()
    assert reconciler.sweep().resent == {Queue.FAST: 1} and broker.sent_fast == [a]
    clock[0] += 1  # only that sweep: the next one waits the age again
    broker.oldest[Queue.FAST, 1] = None
    assert reconciler.sweep().resent == {} and broker.sent_fast == [a]


def test_a_sweep_reports_exactly_what_it_did(sessions):
    """The whole record of a quiet sweep, of a follower's, and of one that finds stranded
    jobs (the figures the workers log and count)."""
    a, b, c = jobs(sessions, "a", "b", "c")
    broker = Broker()
    broker.oldest[Queue.FAST, 1] = sent_at(sessions, a)  # (a's message waits)
    clock = [time.time()]
    leader = Reconciler(sessions, broker, SETTINGS, "me", clock=lambda: clock[0])
    # (PostgreSQL: the submission's changes of the batch's counts, its rows' and its
    # queued jobs', folded into its tallies)
    folded = 2 if is_postgres(sessions.engine) else 0
    assert leader.sweep() == Sweep(leader=True, died=0, released=0, resent={}, folded=folded)
    follower = Reconciler(sessions, Broker(), SETTINGS, "other")
    follower.broker_restarted()
    quiet = follower.sweep()  # (not the lease holder: nothing, nothing counted)
    assert (quiet.leader, quiet.died, quiet.released, quiet.resent) == (False, 0, 0, {})
    assert follower._resend_now is False  # (the leader heals the restart, not a follower)
    for job_id in (b, c):
        sent(sessions, job_id, sent_at(sessions, a) - 60)
    assert leader.sweep() == Sweep(leader=True, resent={Queue.FAST: 2})
    assert sorted(broker.sent_fast) == sorted([b, c])


def test_the_lease_lasts_three_sweep_intervals(sessions):
    """A holder that stops sweeping is replaced after 3 intervals, not before."""
    jobs(sessions, "a")
    settings = Settings(worker_dead_after_s=5, reconcile_after_s=30, reconcile_interval_s=10)
    assert Reconciler(sessions, Broker(), settings, "one").sweep().leader
    with sessions() as session:
        lease = session.get(liveness.Lease, LEASE)
        left = (lease.expires_at - liveness.utcnow()).total_seconds()
    assert 29 <= left <= 30  # (three intervals of 10 s, less the sweep's own time)


def test_held_messages_are_distrusted_for_twice_the_age_after_a_death(sessions):
    (a,) = jobs(sessions, "a")
    broker = Broker()
    clock = [time.time()]
    reconciler = Reconciler(sessions, broker, SETTINGS, "me", clock=lambda: clock[0])
    with sessions.begin() as session:
        liveness.beat(session, "fast-1", "fast")
        session.execute(update(Worker).values(beat_at=Worker.beat_at - timedelta(seconds=60)))
    reconciler.sweep()  # the death: held messages not trusted from here ...
    broker.held = {a}  # (a was taken off the queue long ago, by a live worker)
    after = SETTINGS.recovery.reconcile_after_s
    clock[0] += 2 * after - 1  # ... for 2 x reconcile_after_s: a held one is not there yet
    sent(sessions, a, clock[0] - 600)
    assert reconciler.sweep().resent == {Queue.FAST: 1}
    clock[0] += 2  # then it is trusted again
    sent(sessions, a, clock[0] - 600)
    assert reconciler.sweep().resent == {}
