"""Which workers are alive, which jobs they hold, and who reconciles.

- A worker process writes a heartbeat row every few seconds (``beat``); it is dead once
  its beat is older than ``dead_after_s``, whatever Redis says.
- A claim by a worker names it on the job (``jobs.worker``), so a running job whose
  worker is dead is found at once (``claims.release_orphans``), not after the broker's
  visibility timeout.
- A lease names the one process that reconciles at a time (``hold_lease``): a
  conditional write on a shared row, so it works on PostgreSQL and SQLite alike and
  across machines. It lapses unless renewed.

Times are the writers' clocks (keep machines on NTP); the margins are seconds.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import delete, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from common.store.tables import Lease, Worker, utcnow


def beat(session: Session, worker_id: str, pool: str) -> None:
    """Record that ``worker_id`` is alive now."""
    now = utcnow()
    found = session.execute(update(Worker).where(Worker.id == worker_id).values(beat_at=now))
    if not found.rowcount:  # type: ignore[attr-defined]
        session.add(Worker(id=worker_id, pool=pool, started_at=now, beat_at=now))


def forget(session: Session, worker_id: str) -> None:
    """A worker leaving cleanly: it holds nothing any more."""
    session.execute(delete(Worker).where(Worker.id == worker_id))


def live_workers(session: Session, dead_after_s: float) -> set[str]:
    fresh = utcnow() - timedelta(seconds=dead_after_s)
    return set(session.scalars(select(Worker.id).where(Worker.beat_at >= fresh)))


def forget_dead(session: Session, dead_after_s: float) -> int:
    """Remove the rows of workers whose heartbeat stopped; returns how many died."""
    stale = utcnow() - timedelta(seconds=dead_after_s)
    gone = session.execute(delete(Worker).where(Worker.beat_at < stale))
    return int(gone.rowcount)  # type: ignore[attr-defined]


def hold_lease(session: Session, name: str, holder: str, ttl_s: float) -> bool:
    """Take or renew the lease ``name`` for ``holder``; False while another holds it."""
    now = utcnow()
    renewed = session.execute(
        update(Lease)
        .where(Lease.name == name, or_(Lease.holder == holder, Lease.expires_at < now))
        .values(holder=holder, expires_at=now + timedelta(seconds=ttl_s))
    )
    if renewed.rowcount:  # type: ignore[attr-defined]
        return True
    if session.get(Lease, name) is not None:
        return False
    try:
        with session.begin_nested():
            session.add(Lease(name=name, holder=holder, expires_at=now + timedelta(seconds=ttl_s)))
    except IntegrityError:  # another process created it first: theirs
        return False
    return True


def release_lease(session: Session, name: str, holder: str) -> None:
    """Give up ``name`` if ``holder`` holds it."""
    session.execute(delete(Lease).where(Lease.name == name, Lease.holder == holder))
