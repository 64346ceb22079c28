"""Request and response bodies of the HTTP API (pydantic; they make the OpenAPI docs)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from common.contracts import AnsweredBy, JobStatus, Priority
from common.store.listing import BatchLine
from common.store.reads import BatchCounts
from common.store.tables import Batch, BatchItem, Job

Item = TypeVar("Item")


class Page(BaseModel, Generic[Item]):
    """One page of a listing; its route says the order."""

    data: list[Item]
    next_cursor: str | None = Field(description="pass as ?after= for the next page; null: last")


class JobSpec(BaseModel):
    """One job: an image (exactly one of base64 or a server-side path) and a question."""

    question: str
    options: list[str] | None = Field(None, description="multiple choice, in order (A, B, ...)")
    image_base64: str | None = None
    image_path: str | None = Field(None, description="a file under one of the image_roots")
    image_url: str | None = Field(None, description="refused: this server fetches no URLs")
    idempotency_key: str | None = Field(
        None, description="the same key returns the same job, never a second one"
    )
    batch_id: str | None = Field(None, description="add the job to this batch")
    id: str | None = Field(None, description="your id for the row (in batch results)")
    answer: str | None = Field(None, description="the known right answer, for accuracy")
    priority: Priority | None = Field(
        None,
        description="high (a single job's default), normal or low: which waiting work runs "
        "first; a key may be limited (keys create --max-priority). In a batch, the batch's "
        "priority counts",
    )
    callback_url: str | None = Field(
        None,
        description="a job sent alone: where its end is posted (job.finished, signed with "
        "your callback secret: GET /v1/webhooks/secret), besides your endpoints. In a "
        "batch: refused (name the batch's)",
    )


class JobSubmitted(BaseModel):
    id: str
    status: str
    created: bool = Field(description="false: the idempotency key named an existing job")


class ItemRefused(BaseModel):
    """A job of a batch that was wrong (its image, texts, fields): it is a failed job of
    the batch, with the code and detail a request of it alone would have been refused
    with."""

    index: int = Field(description="its place in the request's jobs, from 0")
    id: str = Field(description="its id (the request's, or the index)")
    job_id: str
    error: str
    detail: str


class BatchSubmitted(BaseModel):
    id: str
    job_ids: list[str] = Field(description="one per job of the request, in order")
    created: bool = Field(description="false: the Idempotency-Key named an existing batch")
    refused: list[ItemRefused] = Field(
        default_factory=list,
        description="the jobs that failed at once, and why (a retry that found the batch "
        "made before lists none: the first answer did)",
    )


class CancelView(BaseModel):
    """What a cancel did: nothing finished is lost, and a second cancel changes nothing."""

    id: str = Field(description="the batch's (or the job's) id")
    cancelled: int = Field(description="jobs that waited and are cancelled now")
    stopping: int = Field(
        description="jobs that were running: each stops at the end of its current step (a "
        "fast micro-batch's answer, if accepted, is kept)"
    )
    kept: int = Field(description="jobs that had finished (or were cancelled) already")


class RequeuedView(BaseModel):
    id: str = Field(description="the batch's id")
    requeued: int = Field(description="jobs that wait for their stage again, and were sent")
    job_ids: list[str]


class JobError(BaseModel):
    code: str | None
    message: str | None


class Timings(BaseModel):
    model_config = ConfigDict(from_attributes=True)  # (read off the job's row)

    created_at: datetime
    fast_started_at: datetime | None
    gated_at: datetime | None
    agent_started_at: datetime | None
    finished_at: datetime | None


class GateView(BaseModel):
    """Phase III on the small model's answer: how sure, against which tau, and whether it
    was accepted (else the job went to the agent)."""

    confidence: float
    threshold: float | None
    accepted: bool


class JobView(BaseModel):
    id: str
    status: str = Field(
        description="queued, deferred, running, done, failed or cancelled (the reason in error)"
    )
    stage: str = Field(description="fast (phases I-III) or agent (phase IV)")
    question: str
    options: list[str] | None
    answered_by: str | None = Field(description="small (accepted by the gate) or large")
    answer: str | None
    confidence: float | None = Field(
        description="how sure the gate was of the answer: set only where the small model's "
        "answer was accepted (an agent's answer has no such figure; see gate)"
    )
    gate: GateView | None = Field(description="the gate's decision, where the small model spoke")
    small_answer: str | None
    screen_needs_tools: bool | None
    defer_reason: str | None
    attempts: int
    priority: Priority
    cancelling: bool = Field(
        False, description="asked to stop while running: it stops at the end of its step"
    )
    timings: Timings
    error: JobError | None
    reviewed_answer: str | None = Field(None, description="a person's answer, if reviewed")
    reviewer: str | None = Field(None, description="the reviewing API key's name")
    reviewed_at: datetime | None = None
    final_answer: str | None = Field(
        None, description="the answer to hand on: the reviewed one, else the model's (answer)"
    )

    @classmethod
    def of(cls, job: Job) -> JobView:
        failed = job.status in (JobStatus.FAILED, JobStatus.CANCELLED)
        return cls(
            id=job.id,
            status=job.status,
            stage=job.stage,
            question=job.question,
            options=job.options,
            answered_by=job.answered_by,
            answer=job.final_answer,
            confidence=job.confidence if job.answered_by == AnsweredBy.SMALL else None,
            gate=None
            if job.confidence is None
            else GateView(
                confidence=job.confidence,
                threshold=job.gate_threshold,
                accepted=job.answered_by == AnsweredBy.SMALL,
            ),
            small_answer=job.small_answer,
            screen_needs_tools=job.screen_needs_tools,
            defer_reason=job.defer_reason,
            attempts=job.attempts,
            priority=Priority.of_rank(job.priority),
            cancelling=job.cancel_requested is not None,
            timings=Timings.model_validate(job),
            error=JobError(code=job.error_code, message=job.error_message) if failed else None,
            **reviewed(job),
        )


def reviewed(job: Job) -> dict[str, Any]:
    """A person's review of the job, as a job and a batch's row both show it."""
    return {
        "reviewed_answer": job.reviewed_answer,
        "reviewer": job.reviewer,
        "reviewed_at": job.reviewed_at,
        "final_answer": job.given_answer,
    }


class SavedView(BaseModel):
    """What the funnel saved against the agent alone, in model seconds (common.store.usage)."""

    seconds: float = Field(
        description="the agent time the accepted jobs did not need, less what the fast stage spent"
    )
    low: float = Field(description="its 95% interval's low end")
    high: float
    share: float | None = Field(description="of the estimated agent-alone time")
    avoided_s: float = Field(description="the accepted jobs' estimated agent time")
    per_job_s: float = Field(description="what one accepted job would have cost the agent")
    agent_alone_s: float
    measured_jobs: int = Field(description="the batch's agent-run jobs the estimate rests on")
    basis: str = Field(
        description="audits: the agent's time on accepted jobs the audit ran; "
        "tool_free_runs: on jobs the screen also called tool-free; turn_model: one agent "
        "turn a job, priced by its tokens (docs/api.md)"
    )


class UsageView(BaseModel):
    """What a batch's jobs cost: model seconds per phase (a batched call's time shared by
    its jobs; GPU-seconds on a GPU) and tokens."""

    jobs: int = Field(description="jobs with a usage record")
    seconds: dict[str, float] = Field(description="screen, speculate, gate, agent, sandbox, audit")
    total_s: float
    tokens_in: int
    tokens_out: int
    accepted: int
    agent_mean_s: float | None = Field(description="the agent's mean time per job it ran")
    saved: SavedView | None = Field(description="null until two of its jobs ran the agent")
    cost: float | None = Field(None, description="with a price per GPU-hour set")
    saved_cost: float | None = None


class BatchView(BaseModel):
    id: str
    name: str
    created_at: datetime
    items: int
    jobs: int
    finished: int
    progress: float = Field(description="finished / jobs")
    by_status: dict[str, int]
    by_answerer: dict[str, int]
    failures: dict[str, int]
    cancelled: dict[str, int] = Field(
        description="cancelled jobs by reason: cancelled (asked), failure_budget"
    )
    stopped: str | None = Field(
        None, description="why the batch was stopped early (its failure budget), if it was"
    )
    beta: float | None = Field(description="share of screened jobs called tool-free")
    alpha: float | None = Field(description="share of speculated answers accepted")
    audit: dict[str, Any] | None = Field(
        None,
        description="the online audit: audited, agreed, agreement, its interval (low, high: "
        "valid at every audit, at level), the baseline, the evidence against it (the "
        "alarm at 1 / level), drifted, and the alarm once raised (with the action taken)",
    )
    usage: UsageView | None = Field(
        None,
        description="what its jobs cost and what the funnel saved; null while the batch "
        "runs, or while a large batch's is worked out (ask again)",
    )

    @classmethod
    def of(
        cls,
        batch: Batch,
        counts: BatchCounts,
        audit: dict[str, Any] | None = None,
        usage: dict[str, Any] | None = None,
    ) -> BatchView:
        return cls(
            id=batch.id,
            name=batch.name,
            created_at=batch.created_at,
            items=counts.items,
            jobs=counts.jobs,
            finished=counts.finished,
            progress=counts.finished / counts.jobs if counts.jobs else 1.0,
            by_status=dict(counts.by_status),
            by_answerer=dict(counts.by_answerer),
            failures=dict(counts.failures),
            cancelled=dict(counts.cancellations),
            stopped=batch.stopped,
            beta=counts.beta,
            alpha=counts.alpha,
            audit=audit,
            usage=None if usage is None else UsageView.model_validate(usage),
        )


class RowView(BaseModel):
    """A row of a batch's results listing: its job's answer, who gave it, how sure the gate
    was, and what is known of it (expected answer, audit, review)."""

    id: str = Field(description="the row's id: the request's, the manifest's or the file's")
    position: int
    job_id: str
    question: str
    options: list[str] | None
    status: str
    answer: str | None = Field(description="the model's answer")
    answered_by: str | None
    confidence: float | None = Field(description="the gate's, on the small model's answer")
    threshold: float | None = Field(description="the gate's tau for that answer")
    error_code: str | None
    expected: str | None
    correct: bool | None = Field(description="the model's answer against expected")
    audit_agrees: bool | None
    reviewed_answer: str | None
    reviewer: str | None
    reviewed_at: datetime | None
    final_answer: str | None = Field(description="the reviewed answer, else the model's")
    why: str | None = Field(
        None, description="in a review queue: audit_disagrees, near_threshold or failed"
    )

    @classmethod
    def of(cls, item: BatchItem, job: Job, correct: bool | None, why: str | None = None) -> RowView:
        return cls(
            id=item.item_id,
            position=item.position,
            job_id=job.id,
            question=job.question,
            options=job.options,
            status=job.status,
            answer=job.final_answer,
            answered_by=job.answered_by,
            confidence=job.confidence,
            threshold=job.gate_threshold,
            error_code=job.error_code,
            expected=item.expected,
            correct=correct,
            audit_agrees=job.audit_agrees,
            **reviewed(job),
            why=why,
        )


class RowsPage(Page[RowView]):
    """A batch's rows, in their order in the batch."""


class BatchLineView(BaseModel):
    id: str
    name: str
    created_at: datetime
    jobs: int
    unfinished: int = Field(description="jobs not yet done or failed")
    by_status: dict[str, int]

    @classmethod
    def of(cls, line: BatchLine) -> BatchLineView:
        batch = line.batch
        by_status = dict(line.by_status)
        return cls(
            id=batch.id,
            name=batch.name,
            created_at=batch.created_at,
            jobs=line.jobs,
            unfinished=line.unfinished,
            by_status=by_status,
        )


class BatchesPage(Page[BatchLineView]):
    """The caller's batches, newest first."""


class JobsPage(Page[JobView]):
    """The caller's jobs, newest first."""
