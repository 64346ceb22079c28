"""How a committed job reaches its stage: one interface, two ways of delivering.

- in-process (``common.pipeline.runner.EmbeddedRunner``): the stages run as threads of this
  process and claim waiting jobs from the store; sending only wakes them;
- Celery (``workers.queues.CeleryDispatcher``): job ids go to the fast or slow queue
  by task name, for ``speceyes worker`` processes anywhere.

The command line (the composition root) picks one; the API, ``annotate`` and the stages
themselves only see ``Dispatcher``.

Work is sent only after the transaction that wrote it commits, or a worker could be
handed a job it cannot see yet (or one that was rolled back). ``Dispatcher.transaction``
makes that the structure rather than a habit::

    with dispatcher.transaction(sessions) as tx:
        job = submit_job(tx.session, ...)
        tx.to_fast([job.id])
    # committed here, then sent
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from common.contracts import JobStatus, Priority, Queue
from common.errors import RetryableError
from common.pipeline.follow import NO_WATCH, RunResult, Watch, follow_store
from common.store import reads, sends

log = logging.getLogger(__name__)


@dataclass
class Outbox:
    """Job ids to send once the transaction they were written in commits."""

    session: Session
    fast: list[str] = field(default_factory=list)
    slow: list[str] = field(default_factory=list)
    audit: list[str] = field(default_factory=list)
    sent_s: float = 0.0  # spent sending, after the commit (for the overhead figures)
    # ids whose rows this transaction wrote with their send time (``Job.sent_at``
    # defaults to now): not stamped again
    stamped: set[str] = field(default_factory=set)

    def to_fast(self, job_ids: Iterable[str], *, stamped: bool = False) -> None:
        self._add(self.fast, job_ids, stamped)

    def to_slow(self, job_ids: Iterable[str], *, stamped: bool = False) -> None:
        self._add(self.slow, job_ids, stamped)

    def _add(self, queue: list[str], job_ids: Iterable[str], stamped: bool) -> None:
        ids = list(job_ids)
        queue.extend(ids)
        if stamped:
            self.stamped.update(ids)

    def unstamped(self) -> list[str]:
        """Every id to send whose send time is not written yet."""
        return [i for i in (*self.fast, *self.slow, *self.audit) if i not in self.stamped]

    def to_audit(self, job_ids: Iterable[str]) -> None:
        self.audit.extend(job_ids)


@dataclass(frozen=True)
class Delivery:
    """How a send delivers its jobs: ``delay_s`` holds them back (a retry); ``takeover``
    marks jobs the sender holds as running and hands back, so the next stage may claim
    them at once; ``retries`` counts the sends after an outage so far (the next backs off
    longer); ``one_each`` (slow) gives each job a message of its own (a worker unpacking
    a message for idle workers); ``priority`` is the jobs' (``Priority.rank``), so a
    broker hands a high one out before the normal ones that wait."""

    delay_s: float | None = None
    takeover: bool = False
    retries: int = 0
    one_each: bool = False
    priority: int = Priority.NORMAL.rank


@dataclass(frozen=True)
class Backlog:
    """What a broker holds, as the reconciler reads it, at a cost that does not grow with
    the backlog: per queue and priority rank (None: every rank, as audits share one list)
    the send time (epoch seconds) of its oldest waiting message, None where none waits;
    and the ids in the messages workers took and have not acknowledged."""

    oldest: dict[tuple[Queue, int | None], float | None]
    held: set[str]


class Dispatcher(ABC):
    """Delivers committed jobs to the fast (phases I-III) and slow (agent) stages, and
    audits to the agent when it has nothing deferred. A dispatcher writes ``deliver``; the
    three sends are the same for all."""

    component: str | None = None  # what ``check`` checks, named in readiness probes
    # whether deliveries carry the jobs' priorities (a broker's queue orders by them; the
    # in-process runner claims in priority order from the store and needs none)
    orders_messages = False
    # whether a send's time is written on its jobs (``Job.sent_at``): a broker's messages
    # can be lost, and the reconciler finds them by it (``common.pipeline.reconcile``)
    stamps_sends = False

    def send_fast(
        self,
        job_ids: Iterable[str],
        *,
        delay_s: float | None = None,
        takeover: bool = False,
        retries: int = 0,
        priority: int = Priority.NORMAL.rank,
    ) -> int:
        """Deliver jobs waiting for the fast stage; returns how many were sent."""
        how = Delivery(delay_s, takeover, retries, priority=priority)
        return self.deliver(Queue.FAST, list(job_ids), how)

    def send_slow(
        self,
        job_ids: Iterable[str],
        *,
        delay_s: float | None = None,
        takeover: bool = False,
        retries: int = 0,
        one_each: bool = False,
        priority: int = Priority.NORMAL.rank,
    ) -> int:
        """Deliver jobs waiting for the agent; as ``send_fast``."""
        how = Delivery(delay_s, takeover, retries, one_each, priority)
        return self.deliver(Queue.SLOW, list(job_ids), how)

    def send_again(
        self,
        sessions: sessionmaker[Session],
        queue: Queue,
        job_ids: Iterable[str],
        **how: Any,
    ) -> int:
        """Send jobs again (a hand-back, a retry, a re-send) at their own priorities, as
        ``transaction`` first sent them; ``how``: ``send_fast``'s or ``send_slow``'s
        options. Where the store cannot say (it is why they are sent again), at normal."""
        ids = list(job_ids)
        urgency: dict[str, int] = {}
        if (self.orders_messages or self.stamps_sends) and ids:
            try:
                with sessions() as session:
                    if self.orders_messages:
                        urgency = reads.priorities(session, ids)
                    if self.stamps_sends:
                        sends.stamp(session, ids)
                        session.commit()
            except SQLAlchemyError:
                log.warning("sending %d job(s) again at normal priority: no store", len(ids))
        send = self.send_fast if queue == Queue.FAST else self.send_slow
        return sum(send(group, priority=rank, **how) for rank, group in _by_priority(ids, urgency))

    def send_audit(
        self,
        job_ids: Iterable[str],
        *,
        delay_s: float | None = None,
        sessions: sessionmaker[Session] | None = None,
    ) -> int:
        """Deliver audits (``common.pipeline.audit``), to be taken only when no deferred
        job waits; with ``sessions``, their send time is written first (a send again)."""
        ids = list(job_ids)
        if self.stamps_sends and sessions is not None and ids:
            try:
                with sessions.begin() as session:
                    sends.stamp(session, ids)
            except SQLAlchemyError:
                log.warning("sending %d audit(s) again unstamped: no store", len(ids))
        return self.deliver(Queue.AUDIT, ids, Delivery(delay_s))

    @abstractmethod
    def deliver(self, queue: Queue, job_ids: list[str], how: Delivery) -> int:
        """Deliver ``job_ids`` to ``queue``; how many were sent. A dispatcher without an
        audit path delivers no audit (0): the audits wait in the store."""

    def wait(
        self, sessions: sessionmaker[Session], batch_id: str, watch: Watch = NO_WATCH
    ) -> RunResult:
        """Return once every job of the batch is finished, or on Ctrl-C. By default the
        work happens elsewhere, so this follows the store (``follow_store``)."""
        return follow_store(sessions, batch_id, watch)

    def message_ids(self, *, held: bool = True) -> set[str] | None:
        """The job ids of the messages the broker holds (waiting; with ``held``, also those
        workers took and have not acknowledged), or None where that cannot be known. It
        reads every message: for inspection, never per sweep (``backlog``)."""
        return None

    def backlog(self) -> Backlog | None:
        """What the reconciler reads of the broker (``Backlog``), or None where messages
        cannot be lost (in-process: nothing to heal)."""
        return None

    def start(self) -> None:  # noqa: B027 -- most dispatchers have nothing to start
        """Begin delivering jobs as they are sent (a server's lifetime)."""

    def check(self) -> None:  # noqa: B027 -- an in-process dispatcher is always there
        """Raise ``BackendUnavailable`` unless jobs can be delivered now."""

    def close(self) -> None:  # noqa: B027
        """Stop delivering; release connections and threads."""

    @contextmanager
    def transaction(
        self,
        sessions: sessionmaker[Session],
        *,
        delay_s: float | None = None,
        on_send_error: Callable[[RetryableError], None] | None = None,
    ) -> Iterator[Outbox]:
        """A transaction whose outbox is sent after it commits (and never if it fails);
        ``delay_s`` holds the sent jobs back that long (retries).

        A send that fails after the commit raises ``BackendUnavailable``, or, with
        ``on_send_error``, is handed to it: the jobs are committed and waiting, and the
        reconciler sends them once the broker is back (``common.pipeline.reconcile``).
        """
        with sessions.begin() as session:
            outbox = Outbox(session)
            yield outbox
            urgency: dict[str, int] = {}  # (the ranks that are not normal)
            if self.orders_messages:
                urgency = reads.priorities(session, [*outbox.fast, *outbox.slow])
            if self.stamps_sends:
                sends.stamp(session, outbox.unstamped())
        started = time.perf_counter()
        try:
            for priority, ids in _by_priority(outbox.fast, urgency):
                self.send_fast(ids, delay_s=delay_s, priority=priority)
            for priority, ids in _by_priority(outbox.slow, urgency):
                self.send_slow(ids, delay_s=delay_s, priority=priority)
            if outbox.audit:
                self.send_audit(outbox.audit, delay_s=delay_s)
        except RetryableError as exc:
            if on_send_error is None:
                raise
            on_send_error(exc)
        finally:
            outbox.sent_s = time.perf_counter() - started


def _by_priority(job_ids: list[str], urgency: dict[str, int]) -> list[tuple[int, list[str]]]:
    """``job_ids`` grouped by priority (``urgency``: the ranks that are not normal), the
    most urgent group first, each in the order given."""
    groups: dict[int, list[str]] = {}
    for job_id in job_ids:
        groups.setdefault(urgency.get(job_id, Priority.NORMAL.rank), []).append(job_id)
    return sorted(groups.items())


class StoreOnly(Dispatcher):
    """Sends nothing: jobs wait in the store for whoever works it (a server with no
    runner). It remembers what it was asked to send, which tests read."""

    def __init__(self) -> None:
        self.sent_fast: list[str] = []
        self.sent_slow: list[str] = []

    def deliver(self, queue: Queue, job_ids: list[str], how: Delivery) -> int:
        sent = {Queue.FAST: self.sent_fast, Queue.SLOW: self.sent_slow}.get(queue)
        if sent is None:
            return 0
        sent += job_ids
        return len(job_ids)


def send_waiting(outbox: Outbox, batch_id: str) -> None:
    """Put every job of the batch that waits for a stage in the outbox (a resumed batch:
    sending again what may be queued already is harmless, as a stage handed a job that no
    longer waits for it does nothing)."""
    outbox.to_fast(reads.job_ids(outbox.session, batch_id, JobStatus.QUEUED))
    outbox.to_slow(reads.job_ids(outbox.session, batch_id, JobStatus.DEFERRED))
