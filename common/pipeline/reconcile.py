"""The reconciler: no job is left waiting for a message that no longer exists.

The store says what should happen; the broker only carries reminders. Each sweep, by
the one process that holds the ``reconciler`` lease (any worker may: they all try):

1. **Orphans.** Running jobs whose worker's heartbeat stopped (``worker_dead_after_s``)
   are put back to wait for their stage and sent again, long before the broker's
   visibility timeout would bring their messages back. For a while after a death the
   messages workers hold unacknowledged are not trusted: the dead one's are among them
   (taken, not started), and would otherwise wait for the visibility timeout.
2. **Stranded.** A job that waits for a stage (``queued`` / ``deferred``) and has no
   message on the broker is suspect; still without one ``reconcile_after_s`` later (so an
   enqueue that is on its way is never doubled) it is sent again. This heals a Redis
   restart without persistence, an enqueue that failed after its commit, a message lost
   with a worker. After a broker restart (its run id changed: ``broker_restarted``) or a
   worker's death (its held messages are gone with it) the next sweep sends them at once.

Sending again is always safe: a job is claimed by a conditional write, so a second
message for it changes nothing (``common.pipeline.work``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from common.config import Settings
from common.contracts import Queue, Stage
from common.pipeline.dispatch import Dispatcher
from common.store import audits, claims, liveness, openai_batches

log = logging.getLogger(__name__)

LEASE = "reconciler"


@dataclass
class Sweep:
    """What one sweep did."""

    leader: bool = False
    died: int = 0  # workers found dead (their heartbeat stopped)
    released: int = 0  # running jobs of dead workers, put back and sent
    resent: dict[Queue, int] = field(default_factory=dict)  # stranded, sent again
    suspects: int = 0  # waiting jobs seen without a message, not yet for long
    expired: int = 0  # OpenAI batches whose completion window closed, their rest cancelled


class Reconciler:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        dispatcher: Dispatcher,
        settings: Settings,
        holder: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sessions, self.dispatcher, self.settings = sessions, dispatcher, settings
        self.holder, self.clock = holder, clock
        self._missing_since: dict[str, float] = {}  # job id -> first sweep that missed it
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
            self._missing_since.clear()
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
        now = self.clock()
        if result.died or result.released:
            log.warning(
                "%d worker(s) died; %d job(s) they ran sent again", result.died, result.released
            )
            self._distrust_held_until = now + 2 * settings.recovery.reconcile_after_s
            # the dead held messages of their own (taken, not started): without a
            # message of their own elsewhere, those jobs are sent again at once
            self._resend_now = True
        self._resend_stranded(result, now, sent={*orphans[Stage.FAST], *orphans[Stage.AGENT]})
        return result

    def _resend_stranded(self, result: Sweep, now: float, sent: set[str]) -> None:
        """Send again the waiting jobs without a message (but those ``sent`` already by
        this sweep)."""
        with self.sessions() as session:
            jobs = claims.waiting_jobs(session)
            waiting = {
                Queue.FAST: jobs[Stage.FAST],
                Queue.SLOW: jobs[Stage.AGENT],
                Queue.AUDIT: audits.waiting(session),
            }
        present = self.dispatcher.message_ids(held=now >= self._distrust_held_until)
        if present is None:  # this dispatcher cannot tell (in-process): nothing to heal
            return
        missing_since = {}
        due: dict[Queue, list[str]] = {}
        for queue, job_ids in waiting.items():
            for job_id in job_ids:
                if job_id in present or job_id in sent:
                    continue
                first = self._missing_since.get(job_id, now)
                waited = now - first >= self.settings.recovery.reconcile_after_s
                if waited or self._resend_now:
                    due.setdefault(queue, []).append(job_id)
                else:
                    missing_since[job_id] = first
        self._missing_since = missing_since
        result.suspects = len(missing_since)
        at_once, self._resend_now = self._resend_now, False
        for queue, job_ids in due.items():
            if queue == Queue.AUDIT:
                result.resent[queue] = self.dispatcher.send_audit(job_ids)
            else:  # (at their own priorities)
                result.resent[queue] = self.dispatcher.send_again(self.sessions, queue, job_ids)
        if result.resent:
            after = self.settings.recovery.reconcile_after_s
            log.warning(
                "sent again %d waiting job(s) that had no message on the broker %s",
                sum(result.resent.values()),
                "after a restart or a death" if at_once else f"for {after:.0f} s",
            )
