"""The reconciler over a real store (SQLite and PostgreSQL) and a broker stand-in that
says which job ids it holds messages for."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from common.config import GateSettings, Settings
from common.contracts import Deferred, JobStatus, Queue, Stage
from common.pipeline.dispatch import StoreOnly
from common.pipeline.reconcile import LEASE, Reconciler, Sweep
from common.store import claims, liveness, submission
from common.store.tables import Job, Worker
from tests.helpers.store import items, new_batch


class Broker(StoreOnly):
    """Records sends; ``present`` are the ids it has messages for."""

    def __init__(self) -> None:
        super().__init__()
        self.present: set[str] = set()
        self.held: set[str] = set()  # taken by workers, not acknowledged

    def message_ids(self, *, held: bool = True) -> set[str]:
        return self.present | (self.held if held else set())


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
    broker.present = {b}  # (b's message is on the broker: only a is the dead one's)
    sweep = Reconciler(sessions, broker, SETTINGS, "me").sweep()
    assert sweep.released == 1 and broker.sent_slow == [a] and broker.sent_fast == []
    with sessions() as session:
        assert session.get(Job, a).status == JobStatus.DEFERRED


def test_a_waiting_job_without_a_message_is_sent_again_only_after_the_age(sessions):
    a, b = jobs(sessions, "a", "b")
    broker = Broker()
    broker.present = {b}
    clock = [1000.0]
    reconciler = Reconciler(sessions, broker, SETTINGS, "me", clock=lambda: clock[0])
    assert reconciler.sweep().suspects == 1 and broker.sent_fast == []  # seen missing
    clock[0] += 10
    assert reconciler.sweep().resent == {} and broker.sent_fast == []  # not for long
    clock[0] += 25
    sweep = reconciler.sweep()
    assert sweep.resent == {Queue.FAST: 1} and broker.sent_fast == [a]
    broker.present.add(a)  # its message is there now: nothing more
    clock[0] += 60
    assert reconciler.sweep().resent == {} and broker.sent_fast == [a]


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
    broker = Broker()
    broker.held = {a}  # taken by some worker, not acknowledged
    clock = [0.0]
    reconciler = Reconciler(sessions, broker, SETTINGS, "me", clock=lambda: clock[0])
    assert reconciler.sweep().suspects == 0  # trusted: a live worker may hold it
    with sessions.begin() as session:
        liveness.beat(session, "fast-1", "fast")
        session.execute(update(Worker).values(beat_at=Worker.beat_at - timedelta(seconds=60)))
    sweep = reconciler.sweep()
    # its held messages died with it: sent again at once, not reconcile_after_s later
    assert (sweep.died, sweep.released, sweep.resent) == (1, 0, {Queue.FAST: 1})
    assert broker.sent_fast == [a]
    clock[0] += 1  # only then: a message still held is trusted again after a while
    assert reconciler.sweep().resent == {} and broker.sent_fast == [a]


def test_a_stranded_deferred_job_goes_to_the_slow_queue(sessions):
    a, b = jobs(sessions, "a", "b")
    with sessions.begin() as session:
        claims.claim_ids(session, [a], Stage.FAST, stale_after_s=None, worker="me")
        claims.record_fast(session, [Deferred(a, "tools_needed")], GateSettings())
    broker = Broker()
    clock = [0.0]
    reconciler = Reconciler(sessions, broker, SETTINGS, "me", clock=lambda: clock[0])
    reconciler.sweep()
    clock[0] += SETTINGS.recovery.reconcile_after_s
    assert reconciler.sweep().resent == {Queue.SLOW: 1, Queue.FAST: 1}
    assert (broker.sent_slow, broker.sent_fast) == ([a], [b])


def test_after_a_broker_restart_every_job_without_a_message_is_sent_at_once(sessions):
    """A restart without persistence loses every message: waiting reconcile_after_s more
    would only delay the healing (a duplicate of a message that survived is harmless)."""
    a, b = jobs(sessions, "a", "b")
    broker = Broker()
    broker.present = {b}
    clock = [0.0]
    reconciler = Reconciler(sessions, broker, SETTINGS, "me", clock=lambda: clock[0])
    reconciler.broker_restarted()
    assert reconciler.sweep().resent == {Queue.FAST: 1} and broker.sent_fast == [a]
    clock[0] += 1  # only that sweep: the next one waits the age again
    broker.present = set()
    assert reconciler.sweep().resent == {} and broker.sent_fast == [a]


def test_a_sweep_reports_exactly_what_it_did(sessions):
    """The whole record of a quiet sweep, of a follower's, and of one that finds stranded
    jobs (the figures the workers log and count)."""
    a, b, c = jobs(sessions, "a", "b", "c")
    broker = Broker()
    broker.present = {a}  # (the first in order has its message: the others are looked at)
    clock = [0.0]
    leader = Reconciler(sessions, broker, SETTINGS, "me", clock=lambda: clock[0])
    assert leader.sweep() == Sweep(leader=True, died=0, released=0, resent={}, suspects=2)
    follower = Reconciler(sessions, Broker(), SETTINGS, "other")
    follower.broker_restarted()
    quiet = follower.sweep()  # (not the lease holder: nothing, nothing counted)
    assert (quiet.leader, quiet.died, quiet.released, quiet.resent, quiet.suspects) == (
        False,
        0,
        0,
        {},
        0,
    )
    assert follower._resend_now is False  # (the leader heals the restart, not a follower)
    clock[0] += SETTINGS.recovery.reconcile_after_s
    assert leader.sweep() == Sweep(leader=True, resent={Queue.FAST: 2}, suspects=0)
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
    clock = [0.0]
    reconciler = Reconciler(sessions, broker, SETTINGS, "me", clock=lambda: clock[0])
    with sessions.begin() as session:
        liveness.beat(session, "fast-1", "fast")
        session.execute(update(Worker).values(beat_at=Worker.beat_at - timedelta(seconds=60)))
    broker.present = {a}
    reconciler.sweep()  # the death: held messages not trusted from here ...
    broker.present, broker.held = set(), {a}
    after = SETTINGS.recovery.reconcile_after_s
    clock[0] += 2 * after - 1  # ... for 2 x reconcile_after_s: a held one is not there yet
    assert reconciler.sweep().suspects == 1
    clock[0] += 2  # then it is trusted again
    assert reconciler.sweep().suspects == 0
