"""The shapes every part of SpecEyes speaks in: statuses, stages, reasons, queries, outcomes.

A job's life, as the ``status`` and ``stage`` columns of its row record it::

    QUEUED ──claim──▶ RUNNING (stage FAST) ──▶ DONE      accepted by the gate
                                           ├─▶ DEFERRED  tools needed, unsure, ... (reason)
                                           └─▶ FAILED    bad image, attempts used up, ...
    DEFERRED ──claim──▶ RUNNING (stage AGENT) ──▶ DONE / FAILED

    QUEUED / DEFERRED ──cancel──▶ CANCELLED (a reason: ``CancelReason``)
    RUNNING ──cancel──▶ (marked) ──▶ the stage ends its step ──▶ DONE / FAILED / CANCELLED
    CANCELLED ──resume──▶ QUEUED / DEFERRED (the stage it was cancelled in)

The enums are ``StrEnum``s: a member equals the string stored in the database and sent in
JSON (``JobStatus.DONE == "done"``), so rows read back as plain strings compare with them.

``Query`` is one job as the funnel sees it (pixels decoded); ``Ticket`` is one claimed job
as the store hands it out (no pixels). The outcomes are what a stage decides for a job;
the store records them (``common.store.claims``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from PIL import Image

if TYPE_CHECKING:
    from common.agents.trajectory import Trajectory
    from common.scores import DepthReplay, TokenScores


class JobStatus(StrEnum):
    QUEUED = "queued"  # waits for the fast stage
    DEFERRED = "deferred"  # waits for the agent
    RUNNING = "running"  # claimed by a stage (``Stage`` says which)
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"  # stopped by its caller or its batch's failure budget (reason)


class Stage(StrEnum):
    FAST = "fast"  # phases I-III, in micro-batches
    AGENT = "agent"  # phase IV, one trajectory


class Queue(StrEnum):
    """The broker queues a message for a job waits on (a ``Dispatcher`` sends to each)."""

    FAST = "fast"  # jobs queued for phases I-III
    SLOW = "slow"  # jobs deferred to the agent
    AUDIT = "audit"  # accepted jobs drawn for an audit (common.pipeline.audit)


class AnsweredBy(StrEnum):
    SMALL = "small"  # M_S, accepted by the gate
    LARGE = "large"  # M_L, at the end of its tool loop


class DeferReason(StrEnum):
    """Why a job left the fast stage for the agent."""

    TOOLS_NEEDED = "tools_needed"  # the screen said tools would help
    LOW_CONFIDENCE = "low_confidence"  # the gate did not accept the small answer
    SMALL_MODEL_ERROR = "small_model_error"  # speculation failed for this job
    SCREEN_ERROR = "screen_error"  # screening failed for this job
    BASELINE = "baseline"  # no speculation at all (speedup baselines)
    SPECREASON = "specreason"  # SpecReason's jobs skip phases I-III (common.agents.specreason)
    CALIBRATION = "calibration"  # a calibration run: speculated AND sent to the agent
    AUDIT_PAUSED = "audit_paused"  # an audit alarm paused accepting (common.pipeline.audit)
    # speculation in depth (common.pipeline.depth): a zoom of the small model's that could
    # not be carried out (no call or answer, a call that does not parse, a refused box),
    # or no answer yet after its D zooms
    ZOOM_INVALID = "zoom_invalid"
    DEPTH_EXHAUSTED = "depth_exhausted"


class FailureCode(StrEnum):
    """Failure codes the pipeline sets itself (errors carry their own ``code`` too)."""

    IMAGE_MISSING = "image_missing"
    IMAGE_CHANGED = "image_changed"
    MODEL_ERROR = "model_error"
    INTERNAL_ERROR = "internal_error"  # failed on every attempt with an unexpected error
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"  # its worker died on every attempt


class CancelReason(StrEnum):
    """Why a job was cancelled (its ``error_code``)."""

    CANCELLED = "cancelled"  # its caller asked (a job's or its batch's cancel)
    FAILURE_BUDGET = "failure_budget"  # its batch failed past its ``max_failure_rate``
    EXPIRED = "expired"  # its batch's completion window closed first (an OpenAI batch)
    SUPERSEDED = "superseded"  # its row reads differently now, and has a new job


class Priority(StrEnum):
    """Which waiting job a stage takes first: high before normal before low, then the
    oldest. A single API job is high by default, a corpus or an API batch normal; an
    audit comes after all of them (its own queue, the broker's lowest step)."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @property
    def rank(self) -> int:
        """The stored order: 0 is taken first (``jobs.priority``)."""
        return _RANKS[self]

    @classmethod
    def of_rank(cls, rank: int | None) -> Priority:
        """The class of a stored rank (none yet, on a row not written: normal)."""
        found = [priority for priority, held in _RANKS.items() if held == rank]
        return found[0] if found else cls.NORMAL


_RANKS = {Priority.HIGH: 0, Priority.NORMAL: 1, Priority.LOW: 2}


FINISHED = (JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED)
"""The statuses a job ends in: nothing changes it after, but a review, a resume or a
retry."""
UNFINISHED = (JobStatus.QUEUED, JobStatus.DEFERRED, JobStatus.RUNNING)
"""The others, named: an index serves a list of values, not a "not in" one."""

WAITING_FOR = {Stage.FAST: JobStatus.QUEUED, Stage.AGENT: JobStatus.DEFERRED}
"""The status a job has while it waits for a stage."""


@dataclass(frozen=True)
class Query:
    """One job as the funnel sees it: a decoded original image and the question."""

    job_id: str
    image: Image.Image
    question: str
    options: tuple[str, ...] | None = None
    image_path: str | None = None  # the file it was decoded from (Thyme hands a JPEG on)
    shown_path: str | None = None  # a benchmark image's path as Thyme's evaluation names it


@dataclass(frozen=True)
class Ticket:
    """A claimed job as a stage receives it: small, no pixels."""

    job_id: str
    image_path: str | None
    image_hash: str | None
    question: str
    options: list[str] | None
    attempts: int = 1  # claims in this stage, this one included
    defer_reason: str | None = None  # why it waits for the agent (``specreason``: runs that)
    shown_path: str | None = None  # Thyme's first turn names the image so (``Query``)
    priority: int = 1  # ``Priority.rank``: a deferral is sent on at the job's own


@dataclass(frozen=True)
class ScreenResult:
    needs_tools: bool
    raw_text: str
    prompt_tokens: int = 0  # the tokens it read and wrote (0: its backend does not say)
    new_tokens: int = 0


class Phase(StrEnum):
    """Where a job's model time went (``Usage``)."""

    SCREEN = "screen"  # phase I, the large model's yes/no
    SPECULATE = "speculate"  # phase II, the small model (its zooms, at depth >= 1)
    GATE = "gate"  # phase III, the answer's separability
    AGENT = "agent"  # phase IV, the agent's generations (SpecReason's proposals too)
    SANDBOX = "sandbox"  # phase IV, its tools: a crop or a sandboxed program
    AUDIT = "audit"  # the agent run on an accepted job to check it (common.pipeline.audit)


@dataclass
class Usage:
    """What one job cost: model seconds per phase and the tokens read and written.

    A batched call's wall time is shared equally by the jobs in it, so a batch's jobs
    add up to its calls' time (on a GPU, GPU-seconds). Kept on the job, a stage a column
    (``Job.fast_usage``, ``Job.agent_usage``), and summed per batch and tenant
    (``common.store.usage``).
    """

    seconds: dict[str, float] = field(default_factory=dict)
    tokens_in: int = 0
    tokens_out: int = 0
    # the agent's turns, in order: each one's tokens read and written and its seconds
    # (what ``common.store.usage`` fits a turn's cost on)
    turns: list[tuple[int, int, float]] = field(default_factory=list)

    def add(self, phase: Phase, seconds: float, tokens_in: int = 0, tokens_out: int = 0) -> None:
        self.seconds[str(phase)] = self.seconds.get(str(phase), 0.0) + seconds
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out

    def merge(self, other: Usage) -> None:
        for phase, seconds in other.seconds.items():
            self.add(Phase(phase), seconds)
        self.tokens_in += other.tokens_in
        self.tokens_out += other.tokens_out  # (turns are one job's: not summed)

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())

    def to_dict(self) -> dict[str, Any]:
        seconds = {phase: round(value, 6) for phase, value in self.seconds.items()}
        shown = {"seconds": seconds, "tokens_in": self.tokens_in, "tokens_out": self.tokens_out}
        if not self.turns:
            return shown
        return {**shown, "turns": [[read, wrote, round(s, 6)] for read, wrote, s in self.turns]}

    @classmethod
    def of(cls, stored: Any) -> Usage:
        """A stored record read back (anything else, or a phase it does not know: none)."""
        if not isinstance(stored, dict):
            return cls()
        seconds = stored.get("seconds")
        kept = {
            str(phase): float(value)
            for phase, value in (seconds.items() if isinstance(seconds, dict) else ())
            if phase in {known.value for known in Phase} and _number(value)
        }
        tokens_in, tokens_out = (_count(stored.get(name)) for name in ("tokens_in", "tokens_out"))
        turns = stored.get("turns")
        kept_turns = [
            (int(turn[0]), int(turn[1]), float(turn[2]))
            for turn in (turns[:MAX_TURNS] if isinstance(turns, list) else ())
            if isinstance(turn, list) and len(turn) == 3 and all(_number(x) for x in turn)
        ]
        return cls(kept, tokens_in, tokens_out, kept_turns)


MAX_TURNS = 256  # a stored record's turns read back at most (a trajectory has a step limit)


MAX_RECORDED = 1e9  # a stored figure past this (seconds or tokens) is no one's: not read


def _number(value: Any) -> bool:
    """A figure a stored record may hold: a finite number, 0 to ``MAX_RECORDED``."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= MAX_RECORDED
    )


def _count(value: Any) -> int:
    return int(value) if _number(value) else 0


@dataclass(frozen=True)
class Accepted:
    """The small model's answer passed the gate: final."""

    job_id: str
    answer: str
    confidence: float
    token_scores: list[float]
    screen: ScreenResult | None
    zoom_steps: tuple[dict[str, Any], ...] = ()  # the small model's zooms (depth >= 1)


@dataclass(frozen=True)
class Deferred:
    """The job goes on to the agent (phase IV)."""

    job_id: str
    reason: DeferReason
    screen: ScreenResult | None = None
    small_answer: str | None = None
    confidence: float | None = None
    detail: str = ""
    replay: TokenScores | None = None  # calibration runs: what replaying any gate needs
    zoom_steps: tuple[dict[str, Any], ...] = ()  # the small model's zooms (depth >= 1)
    depth_replay: DepthReplay | None = None  # calibration runs at depth >= 1: any d <= D


@dataclass(frozen=True)
class Failed:
    job_id: str
    code: str
    message: str


FastOutcome = Accepted | Deferred | Failed


@dataclass(frozen=True)
class AgentOutcome:
    job_id: str
    answer: str | None
    trajectory: Trajectory
    error_code: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class SourceRow:
    """One row of a corpus as its reader found it (``common.sources.corpus``,
    ``common.sources.benchmarks``): a job to submit, or, with ``error``, one that failed alone."""

    position: int  # 0-based order in the source
    item_id: str  # the row's id, or the image path relative to the source
    question: str
    options: list[str] | None = None
    image_path: str | None = None  # absolute
    error: tuple[str, str] | None = None  # (code, message naming file and line)
    expected: str | None = None  # the row's known answer ("answer" column), for accuracy
    split: str | None = None  # a benchmark row's split ("pope/random", ...)
    category: str | None = None
    image_hash: str | None = None  # known already when the reader kept the image
    # a benchmark image's path as Thyme's evaluation names it (read for a Thyme run only)
    shown_path: str | None = None
