"""The Celery queues: job ids onto the fast, slow or audit queue, by task name.

Messages carry job ids only; the job row in the store holds everything else. A fast
message carries a micro-batch of ids (up to ``fast_batch_size``): the broker's cost
(a push, a pop, the unacked bookkeeping and the ack, each a Redis round trip) is paid
per message, so per batch, not per job. A slow message carries up to ``SLOW_PACK``
deferred ids: the worker that takes it runs them one after another, each claimed when it
starts, and sends the ones not started back one id a message whenever the slow queue is
empty (a slow worker may be idle), so a free worker waits at most one trajectory. Audit
messages carry one id. Tasks are sent by name, so whoever enqueues (``speceyes
annotate``, the API, a worker passing jobs on) never imports the task code
(``workers.app``) or a model.

The same ``celery_app`` configuration serves the workers (``workers.app`` registers the
tasks on it): JSON messages, late acknowledgement, the visibility timeout and key prefix
of ``Settings``, and no result backend (results live in the job store).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterable
from typing import Any

import redis
from celery import Celery
from kombu.exceptions import OperationalError

from common.config import Settings
from common.contracts import Queue
from common.errors import BackendUnavailable, ConfigurationError
from common.pipeline.dispatch import Backlog, Delivery, Dispatcher

FAST_TASK = "speceyes.fast"
SLOW_TASK = "speceyes.slow"
AUDIT_TASK = "speceyes.audit"
# The broker's priority step of each job priority (``Priority.rank``): kombu's Redis
# transport keeps a list per step (0, 3, 6, 9) and pops the lowest step first.
BROKER_PRIORITY = {0: 0, 1: 3, 2: 6}
AUDIT_PRIORITY = 9  # audits only when nothing else waits
STEPS = (0, 3, 6, 9)  # kombu's priority steps, a list each
# Deferred jobs a slow message carries: the broker's cost per message shared by this many
# (unpacked again when a slow worker may be idle: ``workers.app``).
SLOW_PACK = 16
# A message's header: when it was sent (epoch seconds), read by the reconciler off the
# oldest message of each list (``CeleryDispatcher.backlog``)
SENT_HEADER = "speceyes_sent"
LAST_MOMENT = 253_402_300_799.0  # 9999-12-31T23:59:59Z: datetime's last second


def celery_app(settings: Settings) -> Any:
    """A Celery app configured from ``settings`` (no tasks registered)."""

    if not settings.broker.url:
        raise ConfigurationError(
            "no broker configured: set SPECEYES_BROKER_URL (e.g. redis://127.0.0.1:6379/0)"
        )
    app = Celery("speceyes", broker=settings.broker.url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_routes={
            FAST_TASK: {"queue": settings.broker.fast_queue},
            SLOW_TASK: {"queue": settings.broker.slow_queue},
            AUDIT_TASK: {"queue": settings.broker.audit_queue},
        },
        task_default_queue=settings.broker.fast_queue,
        broker_connection_retry_on_startup=True,
        broker_transport_options=transport_options(settings),
        worker_hijack_root_logger=False,
        worker_enable_remote_control=False,
    )
    return app


def transport_options(settings: Settings) -> dict[str, Any]:
    """Redis transport options: how soon a dead worker's messages come back."""
    timeout = settings.broker.visibility_timeout_s
    return {
        "visibility_timeout": timeout,
        "global_keyprefix": settings.broker.key_prefix,
        # kombu looks for overdue messages every interval x throttle seconds; keep that
        # well under the timeout so a message comes back soon after it is overdue.
        "unacked_restore_interval": max(1, min(10, int(timeout / 4))),
        "unacked_restore_throttle": 1,
    }


class CeleryDispatcher(Dispatcher):
    """Sends job ids to the queues of ``settings``; reuses one connection per send.
    Waiting for a batch follows the store, where the workers record results (Ctrl-C stops
    the following only: the jobs go on in the workers)."""

    component = "broker"
    orders_messages = True
    stamps_sends = True

    def __init__(self, settings: Settings, app: Any | None = None) -> None:
        self.settings = settings
        self.app = app if app is not None else celery_app(settings)

    def deliver(self, queue: Queue, job_ids: list[str], how: Delivery) -> int:
        """Fast: one message per micro-batch of up to ``fast_batch_size`` ids. Slow:
        messages of up to ``SLOW_PACK`` ids (one each with ``how.one_each``). Audits: on
        their own queue at the lowest priority, so a slow worker takes one only when no
        deferred job waits (kombu's Redis transport pops priority-major). Returns the ids
        sent."""
        broker = self.settings.broker
        if queue == Queue.AUDIT:
            self._send(AUDIT_TASK, broker.audit_queue, job_ids, how.delay_s, None, AUDIT_PRIORITY)
            return len(job_ids)
        options = _options(how.takeover, how.retries)
        step = BROKER_PRIORITY[how.priority]
        if queue == Queue.FAST:
            batches = chunked(job_ids, self.settings.funnel.fast_batch_size)
            self._send(FAST_TASK, broker.fast_queue, batches, how.delay_s, options, step)
            return len(job_ids)
        chunks = chunked(job_ids, 1 if how.one_each else SLOW_PACK)
        payloads = [chunk[0] if len(chunk) == 1 else chunk for chunk in chunks]
        self._send(SLOW_TASK, broker.slow_queue, payloads, how.delay_s, options, step)
        return len(job_ids)

    def check(self) -> None:
        """Raise ``BackendUnavailable`` unless the broker answers."""
        try:
            with self.app.connection_for_write() as connection:
                connection.ensure_connection(max_retries=1, timeout=2)
        except Exception as exc:
            raise BackendUnavailable(f"broker {self._where()} unreachable: {exc}") from exc

    def broker_run(self) -> str | None:
        """The broker server's run id (Redis ``INFO server``), new at each start of it: a
        change means it restarted, and every connection to it was dropped. None when it
        does not answer."""
        client = redis.Redis.from_url(self.settings.broker.url or "", socket_timeout=2)
        try:
            info: dict[str, Any] = client.info("server")
            return str(info.get("run_id") or "") or None
        except redis.RedisError:
            return None
        finally:
            client.close()

    def close(self) -> None:
        self.app.close()

    def _send(
        self,
        task: str,
        queue: str,
        payloads: Iterable[str | list[str]],
        countdown: float | None,
        options: dict[str, Any] | None,
        priority: int | None = None,
    ) -> int:
        """One message per payload (a job id, or a list of them); returns the messages."""
        sent = 0
        try:
            with self.app.producer_or_acquire() as producer:
                for payload in payloads:
                    self.app.send_task(
                        task,
                        args=[payload],
                        kwargs=options,
                        queue=queue,
                        countdown=countdown,
                        producer=producer,
                        priority=priority,
                        headers={SENT_HEADER: time.time()},
                    )
                    sent += 1
        except OperationalError as exc:
            raise BackendUnavailable(f"broker {self._where()} unreachable: {exc}") from exc
        return sent

    def message_ids(self, *, held: bool = True) -> set[str]:
        """Job ids on both queues (and, with ``held``, in messages taken by workers and not
        acknowledged yet), read from Redis: ``BackendUnavailable`` if it does not answer."""

        prefix = self.settings.broker.key_prefix
        client = redis.Redis.from_url(self.settings.broker.url or "", socket_timeout=10)
        try:
            raw: list[bytes] = []
            settings = self.settings
            broker = settings.broker
            for queue in (broker.fast_queue, broker.slow_queue, broker.audit_queue):
                for key in priority_keys(prefix + queue):
                    raw += client.lrange(key, 0, -1)  # type: ignore[arg-type]
            if held:
                held_messages: list[bytes] = client.hvals(prefix + "unacked")  # type: ignore[assignment]
                raw += [_held_message(value) for value in held_messages]
        except redis.RedisError as exc:
            raise BackendUnavailable(f"broker {self._where()} unreachable: {exc}") from exc
        finally:
            client.close()
        return {job_id for message in raw for job_id in _job_ids(message)}

    def backlog(self) -> Backlog:
        """The send time of the oldest message on each queue's list per priority step,
        and the ids workers hold: one ``LINDEX`` per list and the ``unacked`` hash (as
        large as the fleet's prefetch, not the backlog). ``BackendUnavailable`` if Redis
        does not answer."""
        broker = self.settings.broker
        rank_of = {step: rank for rank, step in BROKER_PRIORITY.items()}
        lists: list[tuple[tuple[Queue, int | None], str]] = []
        for queue, name in (
            (Queue.FAST, broker.fast_queue),
            (Queue.SLOW, broker.slow_queue),
            (Queue.AUDIT, broker.audit_queue),
        ):
            for step, key in zip(STEPS, priority_keys(broker.key_prefix + name), strict=True):
                lists.append(((queue, None if queue == Queue.AUDIT else rank_of.get(step)), key))
        client = redis.Redis.from_url(broker.url or "", socket_timeout=10)
        try:
            pipeline = client.pipeline(transaction=False)
            for _, key in lists:
                pipeline.lindex(key, -1)  # (kombu pushes on the left, pops on the right)
            pipeline.hvals(broker.key_prefix + "unacked")
            *tails, held_messages = pipeline.execute()
        except redis.RedisError as exc:
            raise BackendUnavailable(f"broker {self._where()} unreachable: {exc}") from exc
        finally:
            client.close()
        oldest: dict[tuple[Queue, int | None], float | None] = {}
        for (where, _), tail in zip(lists, tails, strict=True):
            if where[1] is None and where[0] != Queue.AUDIT:
                continue  # (a step no job priority maps to: nothing is sent there)
            sent, known = (None if tail is None else _sent_at(tail)), oldest.get(where)
            oldest[where] = known if sent is None else sent if known is None else min(known, sent)
        held = {i for value in held_messages for i in _job_ids(_held_message(value))}
        return Backlog(oldest, held)

    def queue_depth(self, queue: str) -> int:
        """Messages waiting on ``queue`` (on every priority step; not counting those a
        worker holds)."""
        try:
            with self.app.producer_or_acquire() as producer:
                client = producer.channel.client  # (the prefix is added)
                return sum(int(client.llen(key)) for key in priority_keys(queue))
        except (OperationalError, redis.RedisError) as exc:
            raise BackendUnavailable(f"broker {self._where()} unreachable: {exc}") from exc

    def list_bytes(self, queue: str) -> int:
        """What ``queue``'s lists take in Redis's memory (``MEMORY USAGE``, every element
        counted)."""
        client = redis.Redis.from_url(self.settings.broker.url or "", socket_timeout=30)
        try:
            keys = priority_keys(self.settings.broker.key_prefix + queue)
            return sum(int(client.memory_usage(key, samples=0) or 0) for key in keys)
        finally:
            client.close()

    def queue_depths(self) -> dict[str, int]:
        """Messages waiting per queue (not counting those a worker holds)."""
        broker = self.settings.broker
        return {queue: self.queue_depth(queue) for queue in (broker.fast_queue, broker.slow_queue)}

    def delete_keys(self) -> int:
        """Remove every key under this deployment's prefix (scratch deployments only)."""

        prefix = self.settings.broker.key_prefix
        if not prefix:
            raise ConfigurationError("refusing to delete the keys of an unprefixed broker")
        client = redis.Redis.from_url(self.settings.broker.url or "")
        try:
            keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
            return int(client.delete(*keys)) if keys else 0
        finally:
            client.close()

    def _where(self) -> str:
        url = self.settings.broker.url or ""
        return url.split("@")[-1]  # no password in messages


def chunked(items: list[str], size: int) -> list[list[str]]:
    """``items`` in order, ``size`` at a time (the last chunk may be shorter)."""
    return [items[start : start + size] for start in range(0, len(items), size)]


def payload_ids(payload: Any) -> list[str]:
    """The job ids a task's payload names: a list of them, or one id."""
    return [str(one) for one in payload] if isinstance(payload, list) else [str(payload)]


def _options(takeover: bool, retries: int) -> dict[str, Any] | None:
    options: dict[str, Any] = {"takeover": True} if takeover else {}
    if retries:
        options["retries"] = retries
    return options or None


def priority_keys(queue: str) -> list[str]:
    """The Redis lists of a queue: kombu keeps one per priority step, the first unsuffixed."""
    return [queue] + [f"{queue}\x06\x16{step}" for step in STEPS[1:]]


def _held_message(value: bytes) -> bytes:
    """The message inside an ``unacked`` entry: JSON [message, exchange, routing key]."""

    try:
        return json.dumps(json.loads(value)[0]).encode()
    except (ValueError, IndexError, TypeError):
        return b""


def _sent_at(raw: bytes) -> float:
    """When a message on Redis was sent (its ``SENT_HEADER``); 0.0 where it does not say
    (a message from before the header, or not ours) or says no moment a clock can hold
    (NaN, infinite, negative, past year 9999): it then holds everything after it as
    possibly still queued, which only delays a resend, and never stops a sweep."""
    try:
        sent = json.loads(raw)["headers"][SENT_HEADER]
    except (ValueError, KeyError, TypeError):
        return 0.0
    if isinstance(sent, bool) or not isinstance(sent, int | float):
        return 0.0
    return float(sent) if 0.0 <= sent < LAST_MOMENT else 0.0  # (NaN fails both)


def _job_ids(raw: bytes) -> list[str]:
    """The job ids a kombu message on Redis carries (Celery protocol 2: the body is the
    base64 JSON of [args, kwargs, embed]; args[0] is an id, or a fast micro-batch's list
    of them)."""

    try:
        message = json.loads(raw)
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        payload = json.loads(body)[0][0]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return []  # (not one of ours: a foreign or malformed message names no job)
    if isinstance(payload, list):
        return [str(one) for one in payload if isinstance(one, str)]
    return [payload] if isinstance(payload, str) else []
