"""What keeps a worker process honest: heartbeat, reconciler, watchdog, health.

One daemon thread per worker process, every ``heartbeat_s``:

- **heartbeat**: writes the worker's row (``common.store.liveness``); while the database
  does not answer, the worker is not ready;
- **reconciler**: every ``reconcile_interval_s``, one sweep (``common.pipeline.reconcile``); only
  the lease holder among all workers acts;
- **broker restarts**: the broker's run id (Redis ``INFO server``) is read each tick; a
  new one means it restarted and dropped every connection and message. The reconciler
  is told (its next sweep, at once, sends every waiting job again), and the worker's
  Celery consumer must reconnect: each (re)start of it is reported
  (``consumer_connected``, a consumer bootstep in ``workers.app``). One that has not
  reconnected ``consumer_resume_s`` after the restart was seen is stuck (celery#9054's
  kind: its socket died under a failed ack and it never noticed), so the worker leaves;
- **watchdog**: a worker that has started nothing for ``worker_stall_exit_s`` while its
  queue holds messages (a consumer stuck some other way) leaves too.

Beside it, the process's webhook sender (``common.pipeline.notify.Notifier``, a thread
of its own: a slow receiver never holds up a heartbeat).

Leaving: the worker stops being healthy, lets what it runs finish (beating meanwhile),
removes its heartbeat row, so the reconciler hands anything it still held to others at
its next sweep, and exits with status 3 for its supervisor (compose ``restart``,
Kubernetes) to start it again.

``serve_health`` answers ``/healthz`` (the thread is alive and the watchdog content),
``/readyz`` (database and broker answered at the last tick; 503 and the reason if not)
and ``/metrics`` on ``--metrics-port``.

``Repeated`` logs an error once with its traceback, then counts repeats and logs the
count once a minute, so an outage is a few lines, not a traceback per message.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from sqlalchemy.orm import Session, sessionmaker

from common.config import Settings
from common.pipeline.notify import Notifier
from common.pipeline.reconcile import Reconciler
from common.store import liveness
from workers.queues import CeleryDispatcher

log = logging.getLogger(__name__)

STALLED_EXIT = 3


def worker_id(pool: str) -> str:
    return f"{pool}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Repeated:
    """Log each kind of error in full once, then only how often it came back."""

    def __init__(self, logger: logging.Logger, every_s: float = 60.0) -> None:
        self.logger, self.every_s = logger, every_s
        self._seen: dict[str, tuple[float, int]] = {}  # kind -> (last logged, repeats since)
        self._lock = threading.Lock()

    def error(self, kind: str, message: str, *args: Any) -> None:
        now = time.monotonic()
        with self._lock:
            last, repeats = self._seen.get(kind, (0.0, -1))
            if repeats >= 0 and now - last < self.every_s:
                self._seen[kind] = (last, repeats + 1)
                return
            self._seen[kind] = (now, 0)
        if repeats < 0:
            self.logger.exception(message, *args)
        else:
            self.logger.error(
                message + " (%d more time(s) in the last %.0f s)", *args, repeats, now - last
            )

    def cleared(self, kind: str, message: str) -> None:
        """The error of ``kind`` is over: say so once."""
        with self._lock:
            was = self._seen.pop(kind, None)
        if was is not None:
            self.logger.warning(message)


@dataclass
class Supervisor:
    """The worker process's supervision thread (see the module's docstring)."""

    pool: str
    settings: Settings
    sessions: sessionmaker[Session]
    dispatcher: CeleryDispatcher
    worker: str = ""
    exit: Callable[[int], None] = os._exit  # (tests replace it)
    ready: dict[str, str] = field(default_factory=lambda: {"database": "?", "broker": "?"})
    running: int = 0  # tasks running now
    last_active: float = field(default_factory=time.monotonic)  # a task began or ended
    last_tick: float = field(default_factory=time.monotonic)
    stalled: bool = False
    consumer_started: float = 0.0  # the consumer's last (re)connection
    broker_run: str | None = None  # the broker's run id, as last read
    broker_seen: float = 0.0  # when that run id was last read
    # a restart seen and the consumer not back since: (the old run last seen, the new seen)
    broker_restarted: tuple[float, float] | None = None
    leave_wait_s: float = 300.0  # the longest wait for running tasks when leaving

    def __post_init__(self) -> None:
        self.worker = self.worker or worker_id(self.pool)
        self.repeated = Repeated(log)
        self.reconciler = Reconciler(self.sessions, self.dispatcher, self.settings, self.worker)
        self.notifier = Notifier(self.sessions, self.settings.webhooks)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._next_sweep = 0.0

    # -- task bookkeeping (Celery signals) --------------------------------------------
    def task_started(self) -> None:
        with self._lock:
            self.running += 1
            self.last_active = time.monotonic()

    def task_finished(self) -> None:
        with self._lock:
            self.running = max(0, self.running - 1)
            self.last_active = time.monotonic()

    def consumer_connected(self) -> None:
        """The Celery consumer (re)connected to the broker and consumes."""
        with self._lock:
            self.consumer_started = time.monotonic()

    # -- the thread ------------------------------------------------------------------
    def start(self) -> None:
        self.tick()  # the first beat before any message is taken
        threading.Thread(target=self._loop, name="speceyes-supervisor", daemon=True).start()
        self.notifier.start()

    def stop(self) -> None:
        """A clean exit: stop the thread and take this worker's row away."""
        self._stop.set()
        self.notifier.stop()
        try:
            with self.sessions.begin() as session:
                liveness.forget(session, self.worker)
        except Exception:  # leaving anyway; the row goes stale by itself
            log.warning("could not remove this worker's heartbeat row; it expires")

    def _loop(self) -> None:
        while not self._stop.wait(
            min(self.settings.recovery.heartbeat_s, self.settings.recovery.reconcile_interval_s)
        ):
            self.tick()

    def tick(self) -> None:
        """Beat, maybe sweep, watch."""
        self.last_tick = time.monotonic()
        self._beat()
        self._check_broker()
        self._watch_broker_run()
        if self.last_tick >= self._next_sweep and self.ready["database"] == "ok":
            self._next_sweep = self.last_tick + self.settings.recovery.reconcile_interval_s
            try:
                self.reconciler.sweep()
                self.repeated.cleared("sweep", "the reconciler sweeps again")
            except Exception:  # an outage: the next sweep tries again
                self.repeated.error("sweep", "reconciler sweep failed; trying again")
        self._watch()

    def _beat(self) -> None:
        try:
            with self.sessions.begin() as session:
                liveness.beat(session, self.worker, self.pool)
        except Exception as exc:  # reported as not ready, retried
            self.ready["database"] = f"unreachable: {str(exc).splitlines()[0][:200]}"
            self.repeated.error("database", "heartbeat: the database does not answer")
        else:
            self.ready["database"] = "ok"
            self.repeated.cleared("database", "heartbeat: the database answers again")

    def _check_broker(self) -> None:
        try:
            self.dispatcher.check()
        except Exception as exc:
            self.ready["broker"] = f"unreachable: {str(exc).splitlines()[0][:200]}"
            self.repeated.error("broker", "the broker does not answer")
        else:
            self.ready["broker"] = "ok"
            self.repeated.cleared("broker", "the broker answers again")

    def _watch_broker_run(self) -> None:
        """Notice a broker restart; leave if this worker's consumer never came back."""
        now = time.monotonic()
        run = self.dispatcher.broker_run() if self.ready["broker"] == "ok" else None
        if run is not None:
            if self.broker_run is not None and run != self.broker_run:
                log.warning(
                    "the broker restarted: the messages it held are gone; waiting jobs are "
                    "sent again at the next sweep, and this worker's consumer must reconnect"
                )
                # a consumer (re)started after the old run was last seen has reconnected
                self.broker_restarted = (self.broker_seen, now)
                self.reconciler.broker_restarted()
                self._next_sweep = 0.0  # sweep now, not at the next interval
            self.broker_run, self.broker_seen = run, now
        if self.broker_restarted is None:
            return
        gone, seen = self.broker_restarted
        with self._lock:
            back = self.consumer_started > gone
        if back:
            self.broker_restarted = None
        elif now - seen >= self.settings.recovery.consumer_resume_s:
            self._leave(
                "the broker restarted and this worker's consumer has not reconnected in "
                f"{now - seen:.0f} s: it is stuck"
            )

    def _leave(self, why: str) -> None:
        """Let running tasks finish (beating meanwhile), remove the heartbeat row, exit
        for the supervisor to restart this worker."""
        self.stalled = True  # /healthz says so from now on
        log.error("%s. Leaving for the supervisor to restart this worker.", why)
        deadline = time.monotonic() + self.leave_wait_s
        while self.running and time.monotonic() < deadline:
            self._beat()
            time.sleep(0.5)
        self.stop()
        self.exit(STALLED_EXIT)

    def _watch(self) -> None:
        """Exit when messages wait, this worker is idle, and has been for too long."""
        with self._lock:
            idle_s = 0.0 if self.running else time.monotonic() - self.last_active
        if idle_s < self.settings.recovery.worker_stall_exit_s or self.ready["broker"] != "ok":
            return
        try:
            broker = self.settings.broker
            queue = broker.fast_queue if self.pool == "fast" else broker.slow_queue
            waiting = self.dispatcher.queue_depths()[queue]
        except Exception:  # the broker check above reports it
            return
        if waiting:
            self._leave(
                f"{waiting} message(s) wait on {queue} but this worker has taken none for "
                f"{idle_s:.0f} s: its consumer is stuck"
            )
        else:
            self.last_active = time.monotonic()  # nothing to take: idle is fine

    # -- health ------------------------------------------------------------------------
    def health(self, path: str) -> tuple[int, dict[str, Any]]:
        if path == "/healthz":
            stale = time.monotonic() - self.last_tick > 3 * self.settings.recovery.heartbeat_s + 5
            alive = not stale and not self.stalled
            return (200 if alive else 503), {"alive": alive, "worker": self.worker}
        ok = all(state == "ok" for state in self.ready.values())
        return (200 if ok else 503), {"ready": ok, **self.ready, "worker": self.worker}


def serve_health(port: int, supervisor: Supervisor, metrics_app: Callable[..., Any]) -> None:
    """``/healthz``, ``/readyz`` and ``/metrics`` on ``port`` (a daemon thread)."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/readyz"):
            status, body = supervisor.health(path)
            start_response(
                f"{status} {'OK' if status == 200 else 'Service Unavailable'}",
                [("Content-Type", "application/json")],
            )
            return [json.dumps(body).encode()]
        result: list[bytes] = metrics_app(environ, start_response)
        return result

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: Any) -> None:  # probes every few seconds: no log
            pass

    server: WSGIServer = make_server("0.0.0.0", port, app, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, name="speceyes-health", daemon=True).start()
