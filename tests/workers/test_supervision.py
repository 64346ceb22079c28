"""A worker's supervision without Celery: heartbeat, readiness, broker restarts and a
stuck consumer, the stall watchdog, the outage backoff, errors logged once with a count,
the batches' timer re-armed."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from unittest import mock

from common.config import Settings
from common.errors import BackendUnavailable
from common.store import liveness
from workers.app import TimedBatches, backoff_s
from workers.supervision import STALLED_EXIT, Repeated, Supervisor


class Broker:
    """The dispatcher methods supervision calls."""

    def __init__(self, depth: int = 0, up: bool = True) -> None:
        self.depth, self.up = depth, up
        self.run = "run-1"  # the broker server's run id; another after a restart

    def broker_run(self) -> str | None:
        return self.run if self.up else None

    def check(self) -> None:
        if not self.up:
            raise BackendUnavailable("broker redis://x unreachable: refused")

    def queue_depths(self) -> dict[str, int]:
        return {"speceyes.fast": self.depth, "speceyes.slow": self.depth}

    def message_ids(self, *, held: bool = True) -> set[str]:
        return set()

    def send_fast(self, *args, **kwargs) -> int:
        return 0

    send_slow = send_fast


def supervisor(sessions, broker: Broker, **settings) -> Supervisor:
    exits: list[int] = []
    made = Supervisor("slow", Settings(**settings), sessions, broker, exit=exits.append)  # type: ignore[arg-type]
    made.exits = exits  # type: ignore[attr-defined]
    return made


def test_a_tick_beats_and_reports_ready_and_a_clean_stop_removes_the_row(sessions):
    watched = supervisor(sessions, Broker())
    watched.tick()
    with sessions() as session:
        assert watched.worker in liveness.live_workers(session, 30)
    assert watched.health("/readyz") == (
        200,
        {"ready": True, "database": "ok", "broker": "ok", "worker": watched.worker},
    )
    assert watched.health("/healthz")[0] == 200
    watched.stop()
    with sessions() as session:
        assert watched.worker not in liveness.live_workers(session, 30)


def test_a_broker_outage_makes_the_worker_not_ready(sessions):
    watched = supervisor(sessions, Broker(up=False))
    watched.tick()
    status, body = watched.health("/readyz")
    assert status == 503 and body["broker"].startswith("unreachable") and body["database"] == "ok"


def test_an_idle_worker_with_messages_waiting_exits_for_its_supervisor(sessions):
    broker = Broker(depth=5)
    watched = supervisor(sessions, broker, worker_stall_exit_s=60)
    watched.tick()
    assert watched.exits == []  # idle, but not for long
    watched.last_active -= 61
    watched.task_started()  # busy: never stalled
    watched.last_active -= 61
    watched.tick()
    assert watched.exits == []
    watched.task_finished()
    watched.last_active -= 61
    broker.depth = 0
    watched.tick()  # nothing waits: idle is fine
    assert watched.exits == []
    watched.last_active -= 61
    broker.depth = 5
    watched.tick()
    assert watched.exits == [STALLED_EXIT] and watched.health("/healthz")[0] == 503


def test_after_a_broker_restart_a_worker_whose_consumer_reconnected_stays(sessions):
    broker = Broker()
    watched = supervisor(sessions, broker, consumer_resume_s=10)
    watched.consumer_connected()
    watched.tick()
    broker.run = "run-2"  # restarted between two ticks: every connection dropped
    watched.consumer_connected()  # Celery's consumer noticed, reconnected, restarted
    with mock.patch.object(watched.reconciler, "broker_restarted") as told:
        watched.tick()
    told.assert_called_once()  # the next sweep sends the waiting jobs at once
    assert watched.broker_restarted is None  # its consumer is back: nothing to watch
    watched.tick()
    assert watched.exits == []


def test_after_a_broker_restart_a_stuck_consumer_makes_its_worker_leave(sessions):
    """celery#9054's kind: the consumer's socket died under a failed ack, and it never
    reconnected. The worker lets its running task finish, removes its heartbeat row
    (its leftovers go to others at once) and exits for its supervisor."""
    broker = Broker()
    watched = supervisor(sessions, broker, consumer_resume_s=10)
    watched.consumer_connected()
    watched.tick()
    broker.run = "run-2"
    watched.tick()
    assert watched.exits == [] and watched.broker_restarted is not None  # waits a while
    gone, seen = watched.broker_restarted
    watched.broker_restarted = (gone, seen - 11)  # ... 11 s later, no reconnection
    watched.task_started()
    finished = []

    def finish_later(seconds: float) -> None:  # the running task ends while it waits
        finished.append(seconds)
        watched.task_finished()

    with mock.patch("workers.supervision.time.sleep", side_effect=finish_later):
        watched.tick()
    assert finished and watched.running == 0  # waited for the running task
    assert watched.exits == [STALLED_EXIT] and watched.health("/healthz")[0] == 503
    with sessions() as session:
        assert watched.worker not in liveness.live_workers(session, 30)


def test_outage_retries_back_off_doubling_with_jitter_up_to_the_cap():
    settings = Settings(retry_delay_s=2, retry_max_delay_s=60)
    for retries, full in [(0, 2), (1, 4), (3, 16), (10, 60)]:
        waits = [backoff_s(settings, retries) for _ in range(50)]
        assert all(full / 2 <= wait <= full for wait in waits), (retries, waits)
        assert len(set(waits)) > 1  # jittered


def test_a_repeated_error_is_logged_once_then_counted(caplog):
    repeated = Repeated(logging.getLogger("test.repeated"), every_s=60)
    with caplog.at_level(logging.INFO, logger="test.repeated"):
        for _ in range(100):
            try:
                raise ConnectionError("database gone")
            except ConnectionError:
                repeated.error("db", "the store failed")
        repeated._seen["db"] = (repeated._seen["db"][0] - 61, repeated._seen["db"][1])
        repeated.error("db", "the store failed")
        repeated.cleared("db", "the store answers again")
    records = [r for r in caplog.records if r.name == "test.repeated"]
    assert len(records) == 3
    assert records[0].exc_info is not None  # the first in full, with its traceback
    assert "99 more time(s)" in records[1].getMessage() and records[1].exc_info is None
    assert records[2].getMessage() == "the store answers again"


def test_the_batches_timer_is_armed_again_when_the_consumer_restarts():
    task = TimedBatches()
    task._tref = object()  # armed by the consumer before the broker went away
    consumer = SimpleNamespace(
        pool=mock.Mock(),
        hostname="w",
        connection_errors=(),
        event_dispatcher=None,
        timer=mock.Mock(),
    )
    task.Strategy(task, mock.Mock(), consumer)
    assert task._tref is None  # the next message arms the new consumer's timer
