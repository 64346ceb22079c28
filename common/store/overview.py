"""A batch's overview, as its review page draws it: accuracy per split, the gate's
confidences in a histogram against tau, the time per stage, what its jobs cost and what
the funnel saved (``common.store.usage``). Computed in one pass over
the batch's rows, and kept (a few hundred batches) until the batch changes.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from common.contracts import AnsweredBy
from common.protocols.scoring import is_correct
from common.store.analytics import ScoreTally, SplitScore, busy_of
from common.store.expressions import gate_threshold
from common.store.reads import BatchCounts, batch_counts, batch_jobs
from common.store.tables import BatchItem, Job
from common.store.usage import BatchUsage

log = logging.getLogger(__name__)

HISTOGRAM_BINS = 20
# a batch's page and GET /v1/batches/{id} make the overview of a batch this large while
# they answer; a larger one's is made by a thread (a second at 20,000 jobs, 41 at a million)
SOON_AFTER_JOBS = 20_000


@dataclass
class Histogram:
    """The gate's confidence on the small model's answers, in ``HISTOGRAM_BINS`` equal bins
    over [0, 1]: accepted and deferred, each split into right, wrong and unknown."""

    threshold: float | None = None
    bins: dict[str, list[int]] = field(
        default_factory=lambda: {
            f"{fate}_{verdict}": [0] * HISTOGRAM_BINS
            for fate in ("accepted", "deferred")
            for verdict in ("right", "wrong", "unknown")
        }
    )

    def add(self, confidence: float, accepted: bool, right: bool | None) -> None:
        index = min(HISTOGRAM_BINS - 1, max(0, int(confidence * HISTOGRAM_BINS)))
        verdict = "unknown" if right is None else ("right" if right else "wrong")
        self.bins[f"{'accepted' if accepted else 'deferred'}_{verdict}"][index] += 1

    @property
    def tallest(self) -> int:
        return max(
            (sum(series[i] for series in self.bins.values()) for i in range(HISTOGRAM_BINS)),
            default=0,
        )


@dataclass(frozen=True)
class Overview:
    """The expensive half of a batch's page: computed in one pass each, and kept while the
    batch does not change (``overview``)."""

    scored: int
    correct: int
    splits: list[SplitScore]
    histogram: Histogram
    fast_s: float
    agent_s: float
    fast_jobs: int
    agent_jobs: int
    usage: BatchUsage  # what its jobs cost per phase, and what the funnel saved


def overview(session: Session, batch_id: str, counts: BatchCounts | None = None) -> Overview:
    """Accuracy per split (both ways), the confidence histogram and time per stage: a pass
    over the batch's rows, so kept (in this process) until a job of the batch finishes,
    is reviewed or judged (``counts``: the batch's, if already made)."""
    version = _version(session, batch_id, counts)
    found = _kept(batch_id, version)
    if found is None:
        found = _overview_pass(session, batch_id)
        with _overviews_lock:
            _OVERVIEWS[batch_id] = (version, found)
            while len(_OVERVIEWS) > _OVERVIEWS_KEPT:
                _OVERVIEWS.popitem(last=False)  # the least recently used
    return found


def overview_soon(
    sessions: sessionmaker[Session], batch_id: str, counts: BatchCounts
) -> Overview | None:
    """The kept overview, if it is current; else None, and a thread of this process makes
    it (one a batch at a time), for a page that must answer before a million rows are
    scored (18 s at a million jobs; ``speceyes bench scale``)."""
    with sessions() as session:
        version = _version(session, batch_id, counts)
    found = _kept(batch_id, version)
    if found is None:
        with _overviews_lock:
            if batch_id in _MAKING:
                return None
            _MAKING.add(batch_id)
        threading.Thread(
            target=_make, args=(sessions, batch_id), name=f"overview-{batch_id}", daemon=True
        ).start()
    return found


def overview_or_soon(
    sessions: sessionmaker[Session],
    session: Session,
    batch_id: str,
    counts: BatchCounts,
) -> Overview | None:
    """The overview, made now for a batch of at most ``SOON_AFTER_JOBS`` jobs; a larger
    one's is made by a thread (``overview_soon``), None until then."""
    if counts.jobs > SOON_AFTER_JOBS:
        return overview_soon(sessions, batch_id, counts)
    return overview(session, batch_id, counts)


def overview_once_finished(
    sessions: sessionmaker[Session], session: Session, batch_id: str, counts: BatchCounts
) -> Overview | None:
    """As ``overview_or_soon``, but a batch that runs has its overview made by a thread
    too: what a caller polling it reads (``GET /v1/batches/{id}``), so that a poll never
    pays a pass over a batch that changes between two polls."""
    if counts.finished < counts.jobs:
        return overview_soon(sessions, batch_id, counts)
    return overview_or_soon(sessions, session, batch_id, counts)


def _make(sessions: sessionmaker[Session], batch_id: str) -> None:
    """A thread's pass; where the store fails (down, or the database gone), a warning:
    the next read of the batch asks again."""
    try:
        with sessions() as session:
            overview(session, batch_id)
    except SQLAlchemyError as exc:
        log.warning(
            "the overview of batch %s was not made (the next read asks again): %s",
            batch_id,
            str(exc).splitlines()[0],
        )
    finally:
        with _overviews_lock:
            _MAKING.discard(batch_id)


def kept_overview(
    session: Session, batch_id: str, counts: BatchCounts | None = None
) -> Overview | None:
    """The kept overview, if it is current; None (and nothing computed) if not."""
    return _kept(batch_id, _version(session, batch_id, counts))


def _version(session: Session, batch_id: str, counts: BatchCounts | None) -> tuple[Any, ...]:
    counts = counts or batch_counts(session, batch_id)
    return (*counts.version, counts.verdicts)


def _kept(batch_id: str, version: tuple[Any, ...]) -> Overview | None:
    with _overviews_lock:  # the server's threads share the kept overviews
        cached = _OVERVIEWS.get(batch_id)
        if cached is None or cached[0] != version:
            return None
        _OVERVIEWS.move_to_end(batch_id)
        return cached[1]


def _overview_pass(session: Session, batch_id: str) -> Overview:
    """Scores, the confidence histogram and stage times in one pass over the batch's rows
    (columns only): each job's wide row is read once, not once a figure."""
    query = (
        select(
            BatchItem.expected,
            BatchItem.split,
            BatchItem.judge_verdict,
            Job.id,
            Job.status,
            Job.final_answer,
            Job.scored_answer,
            Job.options,
            Job.confidence,
            Job.answered_by,
            Job.small_answer,
            Job.fast_started_at,
            Job.gated_at,
            Job.agent_started_at,
            Job.finished_at,
            Job.fast_usage,
            Job.agent_usage,
            Job.screen_needs_tools,
            Job.audit_usage,
        )
        .join(Job, Job.id == BatchItem.job_id)
        .where(BatchItem.batch_id == batch_id)
    )
    tally, histogram, usage = ScoreTally(), Histogram(), BatchUsage()
    times: dict[str, tuple[Any, ...]] = {}  # a job two rows share is timed once
    for row in session.execute(query.execution_options(yield_per=2000)):
        tally.add(row)
        if row.id not in times:
            usage.add(
                row.fast_usage,
                row.agent_usage,
                row.answered_by,
                row.screen_needs_tools,
                row.audit_usage,
            )
        times[row.id] = (row.fast_started_at, row.gated_at, row.agent_started_at, row.finished_at)
        if row.confidence is None:
            continue
        right = None
        if row.expected is not None:
            right = is_correct(row.small_answer, row.expected, row.options)
        histogram.add(row.confidence, row.answered_by == AnsweredBy.SMALL, right)
    gates = select(Job.gate).where(Job.id.in_(batch_jobs(batch_id)), Job.confidence.is_not(None))
    gate = session.scalars(gates.limit(1)).first()  # tau, as the first speculated job saw it
    histogram.threshold = gate_threshold(gate)
    (scored, correct), splits = tally.result()
    busy = busy_of(list(times.values()))
    return Overview(
        scored,
        correct,
        splits,
        histogram,
        busy.fast_s,
        busy.agent_s,
        busy.fast_jobs,
        busy.agent_jobs,
        usage,
    )


_OVERVIEWS: OrderedDict[str, tuple[tuple[Any, ...], Overview]] = OrderedDict()
_OVERVIEWS_KEPT = 256  # a few KB each (a histogram, a few splits)
_overviews_lock = threading.Lock()
_MAKING: set[str] = set()  # batches whose overview a thread is making (overview_soon)
