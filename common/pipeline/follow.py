"""Following a batch in the store until it is finished: the progress a caller is shown,
a line when nothing finishes for a while, and a store outage ridden out (the workers go
on meanwhile). ``Dispatcher.wait`` follows the store so, unless the work is done in
this process (``common.pipeline.runner.EmbeddedRunner``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from common.store import reads
from common.store.reads import BatchCounts

Progress = Callable[[BatchCounts], None]
Stalled = Callable[[float], None]
Outage = Callable[[float, str | None], None]


@dataclass(frozen=True)
class Watch:
    """What to call while waiting for a batch."""

    on_progress: Progress | None = None  # with the batch's counts, every poll
    on_stall: Stalled | None = None  # once each time nothing finished for a while
    # while the store does not answer: (seconds so far, the reason), every
    # OUTAGE_REPORT_S; then once with (seconds, None) when it answers again
    on_outage: Outage | None = None


OUTAGE_REPORT_S = 10.0
# A follower waits at least this many times as long as its last read of the counts took,
# so following a large batch costs the store a tenth of one connection at most.
FOLLOW_WAIT_PER_READ = 9.0
FOLLOW_WAIT_MAX_S = 5.0  # (one slow read, after a reconnection, must not stop it long)


NO_WATCH = Watch()


@dataclass
class RunResult:
    """How waiting for a batch ended."""

    counts: BatchCounts
    interrupted: bool = False
    released: int = 0  # in-flight jobs put back on an interrupt (in-process only)
    finished_now: int = 0  # jobs that reached done / failed while we waited
    seconds: float = 0.0
    read_s: float = 0.0  # spent reading the counts (following a store)


def follow_store(
    sessions: sessionmaker[Session],
    batch_id: str,
    watch: Watch = NO_WATCH,
    *,
    poll_s: float = 0.5,
    stall_s: float = 30.0,
    deadline_s: float | None = None,
) -> RunResult:
    """Watch the store until the batch is finished (or Ctrl-C, or ``deadline_s``).

    For work done elsewhere (workers): the rows are the progress. ``watch.on_stall(s)`` is
    called once each time nothing has finished for ``stall_s`` (no worker running, most
    likely). A store that stops answering is waited for (``watch.on_outage``), not an
    error: the workers go on. Interrupting stops the watching only.
    """
    on_progress, on_stall = watch.on_progress, watch.on_stall
    started = time.perf_counter()
    outage = _Outage(watch.on_outage)
    counts = outage.counts(sessions, batch_id, poll_s)
    finished_before, last_change, last_finished, warned = (
        counts.finished,
        started,
        counts.finished,
        False,
    )
    try:
        while counts.finished < counts.jobs:
            if on_progress is not None:
                on_progress(counts)
            now = time.perf_counter()
            if deadline_s is not None and now - started > deadline_s:
                break
            if counts.finished != last_finished:
                last_change, last_finished, warned = now, counts.finished, False
            elif not warned and now - last_change > stall_s and on_stall is not None:
                on_stall(now - last_change)
                warned = True
            # polling the store (its rows are the progress), less often as reads grow
            wait_s = FOLLOW_WAIT_PER_READ * outage.last_read_s
            time.sleep(max(poll_s, min(wait_s, FOLLOW_WAIT_MAX_S)))
            counts = outage.counts(sessions, batch_id, poll_s)
    except KeyboardInterrupt:
        result = RunResult(counts, interrupted=True)
    else:
        result = RunResult(counts)
        if on_progress is not None:
            on_progress(counts)
    result.finished_now = result.counts.finished - finished_before
    result.seconds = time.perf_counter() - started
    result.read_s = outage.read_s
    return result


class _Outage:
    """Reading the batch's counts through a store outage: report it, wait, go on."""

    def __init__(self, report: Outage | None) -> None:
        self.report = report
        self.since: float | None = None
        self.reported = 0.0
        self.last_read_s = 0.0  # the last read's seconds
        self.read_s = 0.0  # every read's

    def counts(self, sessions: sessionmaker[Session], batch_id: str, poll_s: float) -> BatchCounts:
        while True:
            try:
                started = time.perf_counter()
                counts = _counts(sessions, batch_id)
                self.last_read_s = time.perf_counter() - started
                self.read_s += self.last_read_s
            except DBAPIError as exc:
                now = time.perf_counter()
                self.since = self.since if self.since is not None else now
                if self.report is not None and now - self.reported >= OUTAGE_REPORT_S:
                    self.reported = now
                    self.report(now - self.since, str(exc.orig or exc).strip().splitlines()[0])
                time.sleep(max(poll_s, 1.0))
                continue
            if self.since is not None:
                if self.report is not None:
                    self.report(time.perf_counter() - self.since, None)
                self.since, self.reported = None, 0.0
            return counts


def _counts(sessions: sessionmaker[Session], batch_id: str) -> BatchCounts:
    with sessions() as session:
        return reads.batch_counts(session, batch_id)
