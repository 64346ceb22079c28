"""The job store's tables (SQLAlchemy 2 ORM). Alembic migrations create them.

- ``jobs``: a unit of work, unique by its idempotency key, and its whole record: the
  question, a pointer to the image (never its pixels), the status, every phase's result,
  timings and the error if any. The row is the source of truth.
- ``batches``: a named group of work (an annotate run, an API batch) with the model and
  gate configuration it ran with.
- ``batch_items``: a batch's rows in order (a manifest line, a file of a folder), each
  pointing at its job. Two rows asking the same thing share one job.

A person's review of an answer is kept on the job, beside the model's answer: the
answer a job gives is the reviewed one where there is one (``Job.given_answer``).

Statuses, stages, reasons and who answered are the enums of ``common.contracts`` (where
a job's life is drawn); the columns hold their string values. ``stage`` says which stage
a running job belongs to, so an interrupted one goes back to ``queued`` or ``deferred``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    TypeDecorator,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from common.contracts import Stage
from common.store.expressions import GateMargin, gate_threshold, partial


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(moment: datetime) -> datetime:
    """``moment`` in UTC, with its zone (a time stored without one was stored in UTC)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def iso_utc(moment: datetime | None) -> str | None:
    """ISO 8601 in UTC, ``Z`` for the zone: how every time leaves the service (the API,
    exports, the command line's JSON)."""
    return None if moment is None else as_utc(moment).isoformat().replace("+00:00", "Z")


class UtcDateTime(TypeDecorator[datetime]):
    """A moment, always read back in UTC with its zone: SQLite hands times back without
    one, PostgreSQL in its session's time zone."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return as_utc(value) if isinstance(value, datetime) else value

    def coerce_compared_value(self, op: Any, value: Any) -> Any:
        """A moment compared with a moment; with anything else (``beat_at - timedelta``:
        an interval) as the plain column type does."""
        if isinstance(value, datetime):
            return self
        return self.impl_instance.coerce_compared_value(op, value)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else as_utc(value)


class Base(DeclarativeBase):
    pass


class Batch(Base):
    __tablename__ = "batches"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)  # same work, same batch
    name: Mapped[str] = mapped_column(String(200), index=True)
    source: Mapped[str] = mapped_column(Text)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # models, agent, gate, funnel mode
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    # the API key's; None: the CLI's (ix_batches_tenant, migration 0007)
    tenant: Mapped[str | None] = mapped_column(String(200), index=True)
    audit_alarm: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # drift, once raised
    # a failure budget (common.store.budgets): once ``budget_after`` jobs have finished,
    # a share of failed ones over ``max_failure_rate`` cancels the rest
    max_failure_rate: Mapped[float | None] = mapped_column(Float)
    budget_after: Mapped[int | None] = mapped_column(Integer)
    stopped: Mapped[str | None] = mapped_column(Text)  # why it was stopped early, if it was
    # where its events go besides the tenant's endpoints (common.store.webhooks), and when
    # its end was last announced (None: not since it was made, resumed or retried)
    callback_url: Mapped[str | None] = mapped_column(Text)
    announced_at: Mapped[datetime | None] = mapped_column(UtcDateTime())


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        # what a batch's counts read (reads.counts_of): this alone, never the wide rows
        Index(
            "ix_jobs_summary",
            "id",
            "status",
            "answered_by",
            "defer_reason",
            "error_code",
            "screen_needs_tools",
            "confidence",
            "audit_status",
            "audit_agrees",
            "fast_started_at",
            "finished_at",
            "reviewed_at",
        ),
        # what a claim in order reads: the waiting jobs by priority, then age
        Index("ix_jobs_claim_order", "status", "priority", "created_at", "id"),
        # a tenant's unfinished jobs (its quota of jobs in flight: reads.unfinished_jobs)
        Index("ix_jobs_tenant_status", "tenant", "status"),
        # a tenant's usage (store.usage), its jobs a day (quotas); not the command line's
        Index("ix_jobs_tenant_finished", "tenant", "finished_at", **partial("tenant IS NOT NULL")),
        Index("ix_jobs_tenant_created", "tenant", "created_at", **partial("tenant IS NOT NULL")),
        # what the reconciler reads (common.pipeline.reconcile): the jobs of a status and
        # priority whose message went out before a time; any read of one status too
        Index("ix_jobs_sent", "status", "priority", "sent_at"),
        Index("ix_jobs_audit_sent", "audit_status", "sent_at"),
        # what a prune reads (common.store.retention): the jobs finished before a date
        Index("ix_jobs_finished", "finished_at"),
        # the failed jobs' codes (reads.failure_codes): few, as SQLite cannot tell
        Index("ix_jobs_failed", "error_code", **partial("status = 'failed'")),
        # the running jobs asked to stop (few at any time): what ``cancels.settle`` reads
        Index("ix_jobs_cancel_requested", "id", **partial("cancel_requested IS NOT NULL")),
        # the review queue's tiers (common.store.reviews): the accepted answers by their
        # margin over tau, and the few answers the audit disagreed with
        Index("ix_jobs_margin", "answered_by", GateMargin()),
        Index(
            "ix_jobs_disagreed",
            "id",
            postgresql_where=text("audit_agrees IS false"),
            sqlite_where=text("audit_agrees IS 0"),
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    idempotency_key: Mapped[str] = mapped_column(String(64), unique=True)
    image_path: Mapped[str | None] = mapped_column(Text)
    image_hash: Mapped[str | None] = mapped_column(String(64))
    question: Mapped[str] = mapped_column(Text)
    options: Mapped[list[str] | None] = mapped_column(JSON)
    # a benchmark image's path as Thyme's evaluation names it (a Thyme run's; in its key)
    shown_path: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))  # (indexed first in ix_jobs_sent)
    stage: Mapped[str] = mapped_column(String(8), default=Stage.FAST)
    # which waiting job a stage takes first (``Priority.rank``: 0 high, 1 normal, 2 low)
    priority: Mapped[int] = mapped_column(SmallInteger, default=1, server_default="1")
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # claims in the current stage

    # phase I
    screen_needs_tools: Mapped[bool | None]
    screen_text: Mapped[str | None] = mapped_column(Text)
    # phases II-III
    small_answer: Mapped[str | None] = mapped_column(Text)
    confidence: Mapped[float | None] = mapped_column(Float)
    token_scores: Mapped[list[float] | None] = mapped_column(JSON)
    gate: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # mode, top_k, threshold
    defer_reason: Mapped[str | None] = mapped_column(String(32))
    replay: Mapped[str | None] = mapped_column(Text)  # calibration runs (common.scores)
    # speculation in depth (common.pipeline.depth): the small model's steps, as AgentStep's
    zoom_steps: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    # calibration runs at depth >= 1: what replaying each depth needs (common.scores)
    zoom_replay: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # phase IV
    trajectory: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # what each stage and its audit cost (common.contracts.Usage: seconds per phase, tokens)
    fast_usage: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    agent_usage: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    audit_usage: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # outcome
    answered_by: Mapped[str | None] = mapped_column(String(8))  # small | large
    final_answer: Mapped[str | None] = mapped_column(Text)
    # the text the reference's scoring reads where it is not final_answer (an unclosed
    # <answer>: the whole output; Thyme's SpecReason: its whole last step); None: the same
    scored_answer: Mapped[str | None] = mapped_column(Text)
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    tenant: Mapped[str | None] = mapped_column(String(200))  # the API key's; None: the CLI's
    worker: Mapped[str | None] = mapped_column(String(100))  # the worker holding it (running)
    # a running job asked to stop: why it is cancelled once its step ends (store.cancels)
    cancel_requested: Mapped[str | None] = mapped_column(String(32))
    # a job sent alone announces its end (``job.finished``, common.store.webhooks) to its
    # tenant's endpoints and its own callback; when that end was last announced
    announces: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    callback_url: Mapped[str | None] = mapped_column(Text)
    announced_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    # the online audit of an accepted answer (common.pipeline.audit): pending, running,
    # done, failed, cancelled (withdrawn by a cancel)
    audit_status: Mapped[str | None] = mapped_column(String(16))  # (ix_jobs_audit_sent)
    audit_answer: Mapped[str | None] = mapped_column(Text)
    audit_agrees: Mapped[bool | None]
    audit_error: Mapped[str | None] = mapped_column(Text)
    audited_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    # a person's review (common.store.reviews): kept beside the model's answer, never over it
    reviewed_answer: Mapped[str | None] = mapped_column(Text)
    reviewer: Mapped[str | None] = mapped_column(String(200))  # the reviewing key's name
    reviewed_at: Mapped[datetime | None] = mapped_column(UtcDateTime())

    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    fast_started_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    gated_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    agent_started_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    # when the job's last message (for its stage or its audit) went to a broker, or would
    # have: a message older than the broker's oldest is gone (common.pipeline.reconcile)
    sent_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), default=utcnow)

    @property
    def scored_text(self) -> str | None:
        """The text the reference's scoring reads: ``scored_answer``, else the answer."""
        return self.final_answer if self.scored_answer is None else self.scored_answer

    @property
    def gate_threshold(self) -> float | None:
        """The tau the gate judged this job's small answer against, if its record holds
        one as a number in [0, 1]."""
        return gate_threshold(self.gate)

    @property
    def trace_steps(self) -> list[dict[str, Any]] | None:
        """The trajectory's steps in order; an entry that is no step reads as an empty one,
        so positions stay the trace's. None: no trajectory, or none with a list of steps."""
        steps = self.trajectory.get("steps") if isinstance(self.trajectory, dict) else None
        return _steps(steps)

    @property
    def small_steps(self) -> list[dict[str, Any]] | None:
        """The small model's zoom steps before the gate (speculation in depth), read as
        ``trace_steps`` reads the agent's. None: it took none."""
        return _steps(self.zoom_steps)

    @property
    def given_answer(self) -> str | None:
        """The answer this job gives: a reviewer's, where there is one, else the model's."""
        return self.reviewed_answer if self.reviewed_at is not None else self.final_answer


class BatchItem(Base):
    __tablename__ = "batch_items"
    # a row found by its id when a corpus is submitted again (a hash index in PostgreSQL:
    # an id may be longer than a B-tree entry may hold)
    __table_args__ = (Index("ix_batch_items_item_id", "item_id", postgresql_using="hash"),)

    batch_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    item_id: Mapped[str] = mapped_column(Text)  # the user's id: manifest id or file path
    expected: Mapped[str | None] = mapped_column(Text)  # the known answer, if the corpus has it
    split: Mapped[str | None] = mapped_column(String(100))  # a benchmark's "pope/random", ...
    category: Mapped[str | None] = mapped_column(String(100))
    judge_verdict: Mapped[bool | None]  # an LLM judge's, where the reference's rules left it
    job_id: Mapped[str] = mapped_column(String(32), ForeignKey("jobs.id"), index=True)


class JudgeVerdict(Base):
    """An LLM judge's verdict, cached by its model and the exact prompt."""

    __tablename__ = "judge_verdicts"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(200))
    verdict: Mapped[bool]
    response: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class ApiKey(Base):
    """A key of the HTTP API: its name and the SHA-256 of the secret, never the secret."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    tenant: Mapped[str] = mapped_column(String(200))  # whose jobs this key submits and reads
    admin: Mapped[bool] = mapped_column(Boolean, default=False)  # reads every tenant's
    # the most urgent priority its jobs may ask for (``Priority.rank``; 0: high)
    max_priority: Mapped[int] = mapped_column(SmallInteger, default=0, server_default="0")
    # its tenant's daily quotas, where the key sets its own (api.quotas; None: the default)
    jobs_per_day: Mapped[int | None] = mapped_column(Integer)
    compute_s_per_day: Mapped[float | None] = mapped_column(Float)


class Worker(Base):
    """A worker process's heartbeat: it is alive while ``beat_at`` is recent."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(100), primary_key=True)  # pool@host:pid:nonce
    pool: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[datetime] = mapped_column(UtcDateTime())
    beat_at: Mapped[datetime] = mapped_column(UtcDateTime())


class Lease(Base):
    """A named role one process holds at a time (the reconciler) until ``expires_at``."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    holder: Mapped[str] = mapped_column(String(100))
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime())


class Control(Base):
    """A deployment-wide switch an audit alarm set: ``paused`` (accept nothing) or
    ``gate_threshold`` (a raised tau). ``speceyes audit resume`` clears them."""

    __tablename__ = "controls"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[Any] = mapped_column(JSON)
    set_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class WebhookEndpoint(Base):
    """A URL a tenant registered for its events (``POST /v1/webhooks``), with the secret
    its deliveries are signed with (Standard Webhooks: ``whsec_`` and base64)."""

    __tablename__ = "webhook_endpoints"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant: Mapped[str | None] = mapped_column(String(200), index=True)  # None: the CLI's
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(JSON)  # the event types it takes
    secret: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    removed_at: Mapped[datetime | None] = mapped_column(UtcDateTime())


class WebhookSecret(Base):
    """The secret a tenant's callback URLs (a batch's or a job's own) are signed with."""

    __tablename__ = "webhook_secrets"

    owner: Mapped[str] = mapped_column(String(200), primary_key=True)  # the tenant; "": the CLI's
    secret: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class WebhookEvent(Base):
    """The outbox: an event, written in the transaction of the change it tells of. Its
    id is the ``webhook-id`` of every delivery of it (receivers deduplicate by it)."""

    __tablename__ = "webhook_events"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant: Mapped[str | None] = mapped_column(String(200))
    type: Mapped[str] = mapped_column(String(32))
    subject: Mapped[str] = mapped_column(String(32))  # the job's or the batch's id
    body: Mapped[str] = mapped_column(Text)  # the JSON sent, exactly as signed
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class WebhookDelivery(Base):
    """An event on its way to one URL: ``pending`` until an answer in 2xx
    (``delivered``) or until its time runs out (``failed``). ``next_at`` is when it is
    tried next; a sender holds it by moving ``next_at`` past its own time limit, so a
    sender that dies mid-delivery leaves it to be tried again (at least once)."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_due", "state", "next_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    event_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("webhook_events.id", ondelete="CASCADE"), index=True
    )
    tenant: Mapped[str | None] = mapped_column(String(200), index=True)
    endpoint_id: Mapped[str | None] = mapped_column(String(32))  # None: a callback URL
    url: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_at: Mapped[datetime] = mapped_column(UtcDateTime())
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime())


class WebhookAttempt(Base):
    """One try of a delivery: when, what answered (a status, or why nothing did)."""

    __tablename__ = "webhook_attempts"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    delivery_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), index=True
    )
    at: Mapped[datetime] = mapped_column(UtcDateTime())
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    seconds: Mapped[float] = mapped_column(Float)


def _steps(steps: Any) -> list[dict[str, Any]] | None:
    if not isinstance(steps, list):
        return None
    return [step if isinstance(step, dict) else {} for step in steps]
