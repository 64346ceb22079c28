"""What the store's results add up to, for reports, calibration and benchmarks:
accuracy per split, stage costs and busy time, calibration items, per-split runs."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from common.contracts import DeferReason, JobStatus
from common.protocols.scoring import is_correct, reference_verdict
from common.scores import DepthReplay
from common.store.reads import BatchCounts, batch_jobs, batch_results, counts_of
from common.store.tables import BatchItem, Job

# how each accuracy counts failed rows, said wherever one is printed
STRICT_COUNTS = "our rules, a failed row is wrong"
REFERENCE_COUNTS = (
    "the evaluation's rules and its LLM judge (--judge-url); a failed row it would still "
    "score (an empty, tagged or cut-off answer) is scored on its text, other failed rows "
    "are left out as its errors are; undecided rows count as wrong"
)


def batch_accuracy(session: Session, batch_id: str) -> tuple[int, int]:
    """(rows with a known answer that are finished, of those answered right)."""
    return batch_scores(session, batch_id)[0]


@dataclass
class SplitScore:
    """A benchmark split's accuracy, both ways; or, for a batch's rows with a known answer
    but no benchmark split (``benchmark`` False), ours alone: the reference has no rules
    for them, so its figure is ours."""

    split: str
    benchmark: bool = True
    rows: int = 0
    failed: int = 0
    strict_correct: int = 0  # our rules; a failed row is wrong
    # the reference's rules, over rows that did not fail and the failed rows it scores
    reference_correct: int = 0
    failed_scored: int = 0  # failed rows the reference scores (on ``Job.scored_answer``)
    undecided: int = 0  # rows the reference's rules leave to its LLM judge (counted wrong)

    @property
    def strict(self) -> float:
        return self.strict_correct / self.rows if self.rows else 0.0

    @property
    def reference(self) -> float:
        """As the reference reports it (``REFERENCE_COUNTS``): the failed rows it would
        score are scored, the others (its errors) left out. Rows of no benchmark have no
        reference: ours (a failed row is wrong)."""
        if not self.benchmark:
            return self.strict
        scored = self.rows - self.failed + self.failed_scored
        return self.reference_correct / scored if scored else 0.0


def scoring_rows(session: Session, batch_id: str) -> Iterator[Any]:
    """The columns scoring reads, row by row (no ORM objects: a 100,000-row batch is
    scored in a fraction of a second)."""
    query = (
        select(
            BatchItem.expected,
            BatchItem.split,
            BatchItem.judge_verdict,
            Job.status,
            Job.final_answer,
            Job.scored_answer,
            Job.options,
        )
        .join(Job, Job.id == BatchItem.job_id)
        .where(BatchItem.batch_id == batch_id)
    )
    yield from session.execute(query.execution_options(yield_per=2000))


def split_scores(session: Session, batch_id: str) -> list[SplitScore]:
    """Per benchmark split, the finished rows with a known answer, scored both ways."""
    return batch_scores(session, batch_id)[1]


def batch_scores(
    session: Session, batch_id: str, *, unsplit: str | None = None
) -> tuple[tuple[int, int], list[SplitScore]]:
    """One pass over the batch: (finished rows with a known answer, of those right by our
    rules), and each benchmark split's scores both ways. With ``unsplit``, the rows with a
    known answer and no split are scored too, by our rules, as a split of that name."""
    tally = ScoreTally(unsplit)
    for row in scoring_rows(session, batch_id):
        tally.add(row)
    return tally.result()


class ScoreTally:
    """Scores rows one at a time (``scoring_rows``' columns), for ``batch_scores`` and
    for whoever scores in a pass of its own (the review pages' overview)."""

    def __init__(self, unsplit: str | None = None) -> None:
        self.unsplit = unsplit
        self.scored = self.correct = 0
        self.scores: dict[str, SplitScore] = {}

    def add(self, row: Any) -> None:
        if row.expected is None or row.status not in (JobStatus.DONE, JobStatus.FAILED):
            return
        right = is_correct(row.final_answer, row.expected, row.options)
        self.scored, self.correct = self.scored + 1, self.correct + right
        if row.split is None and self.unsplit is None:
            return
        if row.split is None:
            score = self.scores.setdefault("", SplitScore(self.unsplit or "", benchmark=False))
        else:
            score = self.scores.setdefault(row.split, SplitScore(row.split))
        score.rows += 1
        failed = row.status == JobStatus.FAILED or row.final_answer is None
        if failed:
            score.failed += 1
            if row.split is None or row.scored_answer is None:
                return  # (an error the evaluation has too: left out of its figure)
            score.failed_scored += 1
        else:
            score.strict_correct += right
        if row.split is None:  # no benchmark: ours stands for the reference's
            score.reference_correct += right
            return
        benchmark = row.split.split("/")[0]
        scored = row.final_answer if row.scored_answer is None else row.scored_answer
        verdict = reference_verdict(benchmark, scored, row.expected, row.options)
        if verdict is None:
            verdict = row.judge_verdict  # the LLM judge's, when one was asked
        score.undecided += verdict is None
        score.reference_correct += bool(verdict)

    def result(self) -> tuple[tuple[int, int], list[SplitScore]]:
        return (self.scored, self.correct), [self.scores[key] for key in sorted(self.scores)]


@dataclass(frozen=True)
class CalibrationItem:
    """A speculated row: the gate's confidence in the small model's answer, whether that
    answer is right (against the known answer, or, in a calibration run without one,
    against the agent's), and what a replay of other gates needs."""

    confidence: float
    right: bool
    gate: dict[str, Any]
    replay: str | None = None  # calibration runs: the recorded logits
    tool_free: bool = True  # the screen's verdict (no screen: every job)
    agent_right: bool | None = None  # calibration runs: the agent's answer, scored
    agrees: bool | None = None  # calibration runs: the small answer matches the agent's
    # calibration runs at depth D >= 1: the zooms' record, and its answer scored as above
    depth: DepthReplay | None = None
    depth_right: bool | None = None
    # calibration runs: the agent's seconds (claim to result) and tokens; the row's split
    agent_seconds: float | None = None
    agent_tokens: int = 0
    split: str | None = None


def stage_costs(session: Session, batch_id: str) -> tuple[float, float]:
    """(fast-stage seconds per job, agent seconds per job) measured in a batch: a fast
    batch's time (claim to record) is shared by the jobs claimed with it; an agent job's
    is its claim to its result."""
    busy = stage_busy(session, batch_id)
    fast = busy.fast_s / busy.fast_jobs if busy.fast_jobs else 0.0
    return fast, (busy.agent_s / busy.agent_jobs if busy.agent_jobs else 0.0)


@dataclass(frozen=True)
class StageBusy:
    """How long each stage worked on a batch: the sum of its fast batches' claim-to-record
    times, and of its trajectories' claim-to-result times."""

    fast_s: float
    fast_jobs: int
    agent_s: float
    agent_jobs: int
    fill_s: float = 0.0  # from the first fast batch's start to the first trajectory's


def stage_busy(session: Session, batch_id: str) -> StageBusy:
    rows = session.execute(
        select(Job.fast_started_at, Job.gated_at, Job.agent_started_at, Job.finished_at).where(
            Job.id.in_(batch_jobs(batch_id))
        )
    ).all()
    return busy_of(rows)


def busy_of(rows: Sequence[Sequence[Any]]) -> StageBusy:
    """``stage_busy`` over jobs' (fast_started_at, gated_at, agent_started_at,
    finished_at), one tuple a job."""
    batches: dict[Any, tuple[float, int]] = {}
    agent = []
    first_fast = min((row[0] for row in rows if row[0] is not None), default=None)
    first_agent = min((row[2] for row in rows if row[2] is not None), default=None)
    for fast_started, gated, agent_started, finished in rows:
        if fast_started is not None and gated is not None:
            _seconds, jobs = batches.get(fast_started, (0.0, 0))
            batches[fast_started] = ((gated - fast_started).total_seconds(), jobs + 1)
        if agent_started is not None and finished is not None:
            agent.append((finished - agent_started).total_seconds())
    return StageBusy(
        sum(seconds for seconds, _ in batches.values()),
        sum(jobs for _, jobs in batches.values()),
        sum(agent),
        len(agent),
        (first_agent - first_fast).total_seconds() if first_agent and first_fast else 0.0,
    )


def calibration_items(session: Session, batch_id: str) -> list[CalibrationItem]:
    """The batch's rows that the small model answered and that can be scored: against a
    reviewer's answer (a person's label), else the row's known answer, else (calibration
    runs) against the agent's answer."""

    found = []
    for item, job in batch_results(session, batch_id):
        if job.small_answer is None or job.confidence is None:
            continue
        calibrating = job.defer_reason == DeferReason.CALIBRATION
        agent = job.final_answer if calibrating else None
        agrees = None if agent is None else is_correct(job.small_answer, agent, job.options)
        label = job.reviewed_answer if job.reviewed_at is not None else item.expected
        if label is not None:
            right = is_correct(job.small_answer, label, job.options)
            # (an agent that failed has no answer: wrong, as a failed row is by our rules)
            ended = calibrating and job.status in (JobStatus.DONE, JobStatus.FAILED)
            agent_right = is_correct(agent, label, job.options) if ended else None
        elif agent is not None and agrees is not None:
            right, agent_right, label = agrees, None, agent  # (the agent's answer is the label)
        else:
            continue
        tool_free = job.screen_needs_tools is not True
        gate = dict(job.gate or {})
        depth = DepthReplay.from_json(job.zoom_replay) if job.zoom_replay else None
        depth_right = None
        if depth is not None and depth.answer is not None:
            depth_right = is_correct(depth.answer, label, job.options)
        agent_seconds = None
        if job.agent_started_at is not None and job.finished_at is not None:
            agent_seconds = (job.finished_at - job.agent_started_at).total_seconds()
        tokens = StepTally()
        tokens.add(job.trajectory)
        found.append(
            CalibrationItem(
                job.confidence,
                right,
                gate,
                job.replay,
                tool_free,
                agent_right,
                agrees,
                depth,
                depth_right,
                agent_seconds,
                tokens.tokens,
                item.split,
            )
        )
    return found


@dataclass
class SplitRun:
    """A split of one batch, for the paper-style report: accuracy, time, beta, alpha, and
    what its trajectories add up to (``steps_of``)."""

    score: SplitScore
    seconds: float  # the split's first claim to its last result
    counts: BatchCounts
    steps: StepTally = field(default_factory=lambda: StepTally())

    @property
    def seconds_per_item(self) -> float:
        return self.seconds / self.score.rows if self.score.rows else 0.0


@dataclass
class StepTally:
    """The steps of a split's trajectories: how many, how many SpecReason kept from the
    small model, and the tokens generated as the reference counts them (every agent
    step; SpecReason's proposals and corrections, never its scoring calls)."""

    trajectories: int = 0
    steps: int = 0
    small_steps: int = 0
    tokens: int = 0

    def add(self, trajectory: Any) -> None:
        steps = trajectory.get("steps") if isinstance(trajectory, dict) else None
        if not isinstance(steps, list):
            return
        self.trajectories += 1
        for step in steps:
            if not isinstance(step, dict):
                continue
            self.steps += 1
            self.small_steps += step.get("proposer") == "small"
            for name in ("new_tokens", "proposal_tokens"):
                value = step.get(name)
                self.tokens += value if isinstance(value, int) else 0


def split_runs(session: Session, batch_id: str, name: str) -> dict[str, SplitRun]:
    """Per benchmark split of the batch: its scores, its wall time and its funnel counts;
    its rows with a known answer and no split are one more, named ``name``."""
    runs: dict[str, SplitRun] = {}
    for score in batch_scores(session, batch_id, unsplit=name)[1]:
        split = BatchItem.split == score.split if score.benchmark else BatchItem.split.is_(None)
        rows = select(BatchItem.job_id).where(BatchItem.batch_id == batch_id, split)
        if not score.benchmark:
            rows = rows.where(BatchItem.expected.is_not(None))
        jobs = rows.subquery()
        # SpecReason's jobs skip the fast stage: their first claim is the agent's
        claimed = func.coalesce(Job.fast_started_at, Job.agent_started_at)
        first, last = session.execute(
            select(func.min(claimed), func.max(Job.finished_at)).where(
                Job.id.in_(select(jobs.c.job_id))
            )
        ).one()
        seconds = (last - first).total_seconds() if first and last else 0.0
        counts = counts_of(session, select(jobs.c.job_id))
        tally = StepTally()
        trajectories = select(Job.trajectory).where(
            Job.id.in_(select(jobs.c.job_id)), Job.trajectory.is_not(None)
        )
        for trajectory in session.scalars(trajectories.execution_options(yield_per=500)):
            tally.add(trajectory)
        runs[score.split] = SplitRun(score, seconds, counts, tally)
    return runs
