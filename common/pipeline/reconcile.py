"""The reconciler: no job is left waiting for a message that no longer exists.

The store says what should happen; the broker only carries reminders. Each sweep, by
the one process that holds the ``reconciler`` lease (any worker may: they all try):

1. **Orphans.** Running jobs whose worker's heartbeat stopped (``worker_dead_after_s``)
   are put back to wait for their stage and sent again, long before the broker's
   visibility timeout would bring their messages back. For a while after a death the
   messages workers hold unacknowledged are not trusted: the dead one's are among them
   (taken, not started), and would otherwise wait for the visibility timeout.
2. **Stranded.** Each job keeps when its last message went out (``Job.sent_at``), and
   the broker's queues are first in, first out per priority. A waiting job whose message
   went out ``reconcile_after_s`` before the oldest message still on its queue (or, on
   an empty queue, before now) has no message there: unless a worker holds it, it is
   sent again. This heals a Redis restart without persistence, an enqueue that failed
   after its commit, a sender killed between its commit and its send. After a broker
   restart (its run id changed: ``broker_restarted``) or a worker's death the next sweep
   does not wait the age.

A sweep reads one message per list, the held messages (as many as the fleet takes at
once) and, per queue and priority, at most ``reconcile_slice`` overdue jobs through an
index: its cost does not grow with the backlog (``common.store.sends``). A job stranded
deep in a backlog is found when its queue reaches it, which is when it would have run.

Sending again is always safe: a job is claimed by a conditional write, so a second
message for it changes nothing (``common.pipeline.work``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy.orm import Session, sessionmaker

from common.config import Settings
from common.contracts import Queue, Stage
from common.pipeline.dispatch import Dispatcher
from common.store import audits, claims, liveness, openai_batches, sends, tallies

log = logging.getLogger(__name__)

LEASE = "reconciler"


@dataclass
class Sweep:
    """What one sweep did."""

    leader: bool = False
    died: int = 0  # workers found dead (their heartbeat stopped)
    released: int = 0  # running jobs of dead workers, put back and sent
    resent: dict[Queue, int] = field(default_factory=dict)  # stranded, sent again
    expired: int = 0  # OpenAI batches whose completion window closed, their rest cancelled
    folded: int | None = 0  # batch count changes moved into the tallies (None: another folds)


class Reconciler:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        dispatcher: Dispatcher,
        settings: Settings,
        holder: str,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sessions, self.dispatcher, self.settings = sessions, dispatcher, settings
        self.holder, self.clock = holder, clock  # (the wall clock: sends are stamped by it)
        self._distrust_held_until = -math.inf  # (held messages trusted until a death)
        self._resend_now = False

    def broker_restarted(self) -> None:
        """The broker restarted (its run id changed): whatever it held may be gone, so the
        next sweep sends every waiting job without a message at once, not
        ``reconcile_after_s`` later (a duplicate of one that survived changes nothing)."""
        self._resend_now = True

    def sweep(self) -> Sweep:
        """One pass; does nothing unless this process holds the lease."""
        settings = self.settings
        result = Sweep()
        with self.sessions.begin() as session:
            ttl = 3 * settings.recovery.reconcile_interval_s
            result.leader = liveness.hold_lease(session, LEASE, self.holder, ttl)
        if not result.leader:
            self._resend_now = False  # (the leader saw the restart too)
            return result
        with self.dispatcher.transaction(self.sessions) as outbox:
            live = liveness.live_workers(outbox.session, settings.recovery.worker_dead_after_s)
            orphans = claims.release_orphans(outbox.session, live)
            orphan_audits = audits.release_orphans(outbox.session, live)
            result.died = liveness.forget_dead(
                outbox.session, settings.recovery.worker_dead_after_s
            )
            outbox.to_fast(orphans[Stage.FAST])
            outbox.to_slow(orphans[Stage.AGENT])
            outbox.to_audit(orphan_audits)
        result.released = len(orphans[Stage.FAST]) + len(orphans[Stage.AGENT])
        with self.sessions.begin() as session:  # (OpenAI batches past their window)
            result.expired = len(openai_batches.expire_due(session))
        with self.sessions.begin() as session:  # (what the batches' counts changed by)
            result.folded = tallies.fold(session)
        now = self.clock()
        if result.died or result.released:
            log.warning(
                "%d worker(s) died; %d job(s) they ran sent again", result.died, result.released
            )
            self._distrust_held_until = now + 2 * settings.recovery.reconcile_after_s
            # the dead held messages of their own (taken, not started): without a
            # message of their own elsewhere, those jobs are sent again at once
            self._resend_now = True
        sent = {*orphans[Stage.FAST], *orphans[Stage.AGENT], *orphan_audits}
        self._resend_stranded(result, now, sent)
        return result

    def _resend_stranded(self, result: Sweep, now: float, sent: set[str]) -> None:
        """Send again the waiting jobs whose message is gone (but those ``sent`` already by
        this sweep)."""
        backlog = self.dispatcher.backlog()
        if backlog is None:  # this dispatcher loses no message (in-process)
            return
        recovery = self.settings.recovery
        at_once, self._resend_now = self._resend_now, False
        margin = 0.0 if at_once else recovery.reconcile_after_s
        trusted = now >= self._distrust_held_until
        skip = sent | (backlog.held if trusted else set())
        due: dict[Queue, list[str]] = {}
        with self.sessions() as session:
            if at_once and not trusted:  # (a death: what workers held may have died too)
                for queue, job_ids in sends.waiting_of(session, backlog.held - sent).items():
                    due.setdefault(queue, []).extend(job_ids)
                skip = skip | backlog.held
            for (queue, rank), oldest in backlog.oldest.items():
                horizon = (now if oldest is None else min(oldest, now)) - margin
                before = datetime.fromtimestamp(horizon, UTC)
                limit = recovery.reconcile_slice
                found = sends.overdue(session, queue, rank, before, limit + len(skip))
                due.setdefault(queue, []).extend([i for i in found if i not in skip][:limit])
        for queue, job_ids in due.items():
            if not job_ids:
                continue
            if queue == Queue.AUDIT:
                result.resent[queue] = self.dispatcher.send_audit(job_ids, sessions=self.sessions)
            else:  # (at their own priorities)
                result.resent[queue] = self.dispatcher.send_again(self.sessions, queue, job_ids)
        if result.resent:
            log.warning(
                "sent again %d waiting job(s) whose message had left the broker %s",
                sum(result.resent.values()),
                "after a restart or a death" if at_once else f"over {margin:.0f} s ago",
            )
