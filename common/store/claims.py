"""Claims and records: the job state machine, every write of it idempotent.

A worker may be handed the same job twice (a redelivered message, a restarted run), so
each state change is a conditional UPDATE that names the state it expects: a claim needs
the job waiting for the stage (or held by a dead worker); recording a fast-stage outcome
needs ``running`` in stage ``fast``; recording an agent outcome needs ``running`` in stage
``agent``. A second recording of the same job finds the state already changed and
touches nothing, so a job has exactly one result. The statuses are drawn in
``common.contracts``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from functools import cache
from typing import Any, cast

from sqlalchemy import Table, and_, bindparam, func, or_, select, text, update
from sqlalchemy.orm import Session

from common.config import GateSettings
from common.contracts import (
    WAITING_FOR,
    Accepted,
    AgentOutcome,
    AnsweredBy,
    Failed,
    FastOutcome,
    JobStatus,
    ScreenResult,
    Stage,
    Ticket,
    Usage,
)
from common.scores import encode
from common.store import arrays, budgets, cancels, webhooks
from common.store.db import is_postgres
from common.store.reads import batch_jobs
from common.store.tables import Job, utcnow

_JOBS = cast(Table, Job.__table__)


def _update() -> Any:
    """An UPDATE of jobs that leaves loaded objects alone (no ORM bookkeeping per row):
    every write here names the row state it expects, and readers load afresh."""
    return update(Job).execution_options(synchronize_session=False)


def release_running(
    session: Session, batch_id: str | None = None, *, count_attempt: bool = True
) -> int:
    """Put running jobs back to wait for their stage (a restart after a crash, or Ctrl-C).

    ``count_attempt=False`` gives the claim's attempt back: an interrupt is not the job's
    doing. A crash may be (a job that kills its process), so a restart counts it.
    """
    released = 0
    for stage, waiting in WAITING_FOR.items():
        statement = _update().where(Job.status == JobStatus.RUNNING, Job.stage == stage)
        if batch_id is not None:
            statement = statement.where(Job.id.in_(batch_jobs(batch_id)))
        values: dict[str, Any] = {"status": waiting}
        if not count_attempt:
            values["attempts"] = Job.attempts - 1
        released += session.execute(statement.values(**values)).rowcount  # type: ignore[attr-defined]
    cancels.settle(session)  # (a job asked to stop while it ran stops here)
    return released


def claim(session: Session, stage: Stage, limit: int, batch_id: str | None = None) -> list[Ticket]:
    """Move up to ``limit`` jobs waiting for ``stage`` to running: the most urgent first
    (``Priority``), then the oldest (``ix_jobs_claim_order`` serves the order)."""
    waiting = WAITING_FOR[stage]
    order = (Job.priority, Job.created_at, Job.id)
    query = select(Job.id).where(Job.status == waiting).order_by(*order).limit(limit)
    if batch_id is not None:
        query = query.where(Job.id.in_(batch_jobs(batch_id)))
    ids = list(session.scalars(query.with_for_update(skip_locked=True)))
    if not ids:
        return []
    statement = (
        _update()
        .where(Job.id.in_(ids), Job.status == waiting)
        .values(
            status=JobStatus.RUNNING,
            stage=stage,
            attempts=Job.attempts + 1,
            **{_started(stage).key: utcnow()},
        )
        .returning(*_TICKET_COLUMNS, Job.created_at)
    )
    return _tickets(session.execute(statement).all())


def claim_ids(
    session: Session,
    job_ids: Sequence[str],
    stage: Stage,
    *,
    stale_after_s: float | None,
    takeover: bool = False,
    worker: str | None = None,
    untried_only: bool = False,
) -> list[Ticket]:
    """Claim the named jobs for ``stage`` (a message carried their ids).

    A job is claimed when it waits for the stage (``queued`` for fast, ``deferred`` for
    agent), or when it has been ``running`` in the stage for over ``stale_after_s`` (the
    worker that held it died and its message came back; ``None``: never), or at once with
    ``takeover``
    (the message was sent again by the worker that held the job and could not finish or
    release it). Jobs that are finished, waiting for the other stage, or running elsewhere
    right now are left alone. Each claim counts one attempt; the tickets carry the count.
    ``worker`` names the claiming worker on the job (its heartbeat vouches for it).
    ``untried_only``: only waiting jobs never claimed in the stage (a job tried before,
    handed back when its worker died, is claimed on its own: ``FastWork.run_ids``).
    """
    now = utcnow()
    stale = None  # running jobs started before this are claimed too (none: no running job)
    if takeover:
        stale = now  # (however recently it started)
    elif stale_after_s is not None:
        stale = now - timedelta(seconds=stale_after_s)
    parameters = {"ids": list(job_ids), "now": now, "stale": stale, "worker": worker}
    held = stale is not None
    rows = session.execute(_claim_statement(stage, untried_only, held), parameters).all()
    return _tickets(rows)


@cache
def _claim_statement(stage: Stage, untried_only: bool, held: bool) -> Any:
    """``claim_ids``'s UPDATE ... RETURNING, built once per kind (a statement built anew
    for each claim costs more to make than to run): ``ids``, ``now``, ``stale`` and
    ``worker`` are its parameters. ``held``: running jobs claimed once started before
    ``stale``."""
    started = _JOBS.c[_started(stage).key]
    # The rows are found by primary key alone: the status is tested through an
    # expression no index serves. The planner's estimate of how many jobs have a status
    # drifts as a run moves them from one to the next (autovacuum analyzes a minute
    # late), and a claim planned through the status index reads every job of that status:
    # 15 ms a claim of 32 at 20,000 waiting, growing with the backlog.
    status = func.coalesce(_JOBS.c.status, "")
    claimable: Any = status == WAITING_FOR[stage]
    if untried_only:
        claimable = and_(claimable, _JOBS.c.attempts == 0)
    if held:
        running = and_(
            status == JobStatus.RUNNING,
            _JOBS.c.stage == stage,
            started <= bindparam("stale"),
        )
        claimable = or_(claimable, running)
    # One UPDATE ... RETURNING: a row another transaction is claiming right now is waited
    # for, then re-checked, so two deliveries of one job never both claim it.
    return (
        update(_JOBS)
        .where(_JOBS.c.id.in_(bindparam("ids", expanding=True)), claimable)
        .values(
            status=JobStatus.RUNNING,
            stage=stage,
            attempts=_JOBS.c.attempts + 1,
            worker=bindparam("worker"),
            **{started.key: bindparam("now")},
        )
        .returning(*(_JOBS.c[column.key] for column in _TICKET_COLUMNS), _JOBS.c.created_at)
    )


_TICKET_COLUMNS = (
    Job.id,
    Job.image_path,
    Job.image_hash,
    Job.question,
    Job.options,
    Job.attempts,
    Job.defer_reason,
    Job.shown_path,
    Job.priority,
)


def _tickets(rows: Sequence[Any]) -> list[Ticket]:
    """Claimed rows (``_TICKET_COLUMNS`` + created_at) as tickets, oldest first."""
    ordered = sorted(rows, key=lambda row: (row.priority, row.created_at, row.id))
    return [Ticket(*row[: len(_TICKET_COLUMNS)]) for row in ordered]


def _started(stage: Stage) -> Any:
    """The column that records when a job was last claimed for ``stage``."""
    return Job.fast_started_at if stage == Stage.FAST else Job.agent_started_at


def statuses(session: Session, job_ids: Sequence[str]) -> dict[str, str]:
    """Job id -> status, for the ids that exist."""
    query = select(Job.id, Job.status).where(Job.id.in_(list(job_ids)))
    return {job_id: status for job_id, status in session.execute(query)}


def release_ids(
    session: Session, job_ids: Sequence[str], stage: Stage, *, count_attempt: bool
) -> int:
    """Put claimed jobs back to wait for ``stage`` again (a retry, not a result).

    ``count_attempt=False`` gives the claim's attempt back: the job did nothing wrong
    (a model server was down), so the outage does not use up its attempts.
    """
    values: dict[str, Any] = {"status": WAITING_FOR[stage]}
    if not count_attempt:
        values["attempts"] = Job.attempts - 1
    statement = _update().where(Job.id.in_(list(job_ids)), Job.status == JobStatus.RUNNING)
    result = session.execute(statement.where(Job.stage == stage).values(**values))
    cancels.settle(session, job_ids)
    return int(result.rowcount)  # type: ignore[attr-defined]


def fail_running(session: Session, job_id: str, stage: Stage, code: str, message: str) -> bool:
    """Fail a job this worker holds (over its attempt limit, or an error of its own)."""
    values = {
        "status": JobStatus.FAILED,
        "error_code": code,
        "error_message": message,
        "finished_at": utcnow(),
    }
    statement = _running_update(stage, tuple(sorted(values)))
    result = session.execute(statement, {"job_id": job_id, **values})
    cancels.settle(session, [job_id])
    budgets.check(session, [job_id])
    webhooks.jobs_ended(session, [job_id])
    return bool(result.rowcount)  # type: ignore[attr-defined]


def record_fast(
    session: Session,
    outcomes: Iterable[FastOutcome],
    gate: GateSettings,
    usage: Mapping[str, Usage] | None = None,
) -> int:
    """Record a fast-stage batch's outcomes (and what each job used, from ``usage``);
    returns how many rows changed.

    Outcomes that write the same columns (accepted, deferred, failed) go in one statement
    each: on PostgreSQL one UPDATE from their columns as arrays (``common.store.arrays``),
    elsewhere an executemany. A job cancelled while its micro-batch ran keeps an accepted
    answer, and is cancelled rather than deferred (``cancels.settle``).
    """
    now = utcnow()
    gate_used = {"mode": gate.mode, "top_k": gate.top_k, "threshold": gate.threshold}
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    ids = []
    for outcome in outcomes:
        ids.append(outcome.job_id)
        values = _fast_values(outcome, gate_used, now)
        if usage is not None and outcome.job_id in usage:
            values["fast_usage"] = usage[outcome.job_id].to_dict()
        groups.setdefault(tuple(sorted(values)), []).append({"id": outcome.job_id, **values})
    postgres = is_postgres(session)
    changed = 0
    for columns, rows in groups.items():
        if postgres:
            parameters = arrays.as_arrays(_JOBS, rows, ("id", *columns))
            parameters.update(expect_status=JobStatus.RUNNING, expect_stage=Stage.FAST)
            result = session.execute(_unnested_update(columns), parameters)
        else:
            renamed = [{"job_id": row.pop("id"), **row} for row in rows]
            result = session.execute(_running_update(Stage.FAST, columns), renamed)
        changed += max(0, result.rowcount)  # type: ignore[attr-defined]
    cancels.settle(session, ids)
    finished = [o.job_id for o in outcomes if isinstance(o, Failed | Accepted)]
    budgets.check(session, finished)
    webhooks.jobs_ended(session, finished)
    return changed


@cache
def _unnested_update(columns: tuple[str, ...]) -> Any:
    """One UPDATE of the running fast jobs named in the ``id`` array, ``columns`` from
    theirs."""
    assignments = ", ".join(f"{name} = {arrays.value(_JOBS, name)}" for name in columns)
    return text(
        f"UPDATE jobs SET {assignments} FROM {arrays.unnest_from(_JOBS, ('id', *columns))} "
        "WHERE jobs.id = rows.c_id AND jobs.status = :expect_status "
        "AND jobs.stage = :expect_stage"
    )


@cache
def _running_update(stage: Stage, columns: tuple[str, ...]) -> Any:
    """The UPDATE of one job running in ``stage`` (``job_id``), ``columns`` from the
    parameters of the same names; built once per kind."""
    return (
        update(_JOBS)
        .where(_JOBS.c.id == bindparam("job_id"))
        .where(_JOBS.c.status == JobStatus.RUNNING, _JOBS.c.stage == stage)
        .values({column: bindparam(column) for column in columns})
    )


def _fast_values(outcome: FastOutcome, gate_used: dict[str, Any], now: Any) -> dict[str, Any]:
    if isinstance(outcome, Failed):
        return {
            "status": JobStatus.FAILED,
            "error_code": outcome.code,
            "error_message": outcome.message,
            "finished_at": now,
        }
    common = {
        "gated_at": now,
        **_screen_values(outcome.screen),
        **({"zoom_steps": list(outcome.zoom_steps)} if outcome.zoom_steps else {}),
    }
    if isinstance(outcome, Accepted):
        return {
            "status": JobStatus.DONE,
            "answered_by": AnsweredBy.SMALL,
            "final_answer": outcome.answer,
            "small_answer": outcome.answer,
            "confidence": outcome.confidence,
            "token_scores": outcome.token_scores,
            "gate": gate_used,
            "finished_at": now,
            **common,
        }
    return {
        "status": JobStatus.DEFERRED,
        "stage": Stage.AGENT,
        "attempts": 0,  # attempts count per stage
        "defer_reason": outcome.reason,
        "small_answer": outcome.small_answer,
        "confidence": outcome.confidence,
        "gate": gate_used if outcome.confidence is not None else None,
        "error_message": outcome.detail or None,
        **({"replay": encode(outcome.replay)} if outcome.replay is not None else {}),
        **({"zoom_replay": outcome.depth_replay.to_json()} if outcome.depth_replay else {}),
        **common,
    }


def _screen_values(screen: ScreenResult | None) -> dict[str, Any]:
    if screen is None:
        return {}
    return {"screen_needs_tools": screen.needs_tools, "screen_text": screen.raw_text}


def record_agent(session: Session, outcome: AgentOutcome | Failed) -> bool:
    """Record a trajectory's end (or a job that failed before it began)."""
    now = utcnow()
    values: dict[str, Any]
    if isinstance(outcome, Failed):
        values = {
            "status": JobStatus.FAILED,
            "error_code": outcome.code,
            "error_message": outcome.message,
        }
    elif outcome.answer is not None:
        values = {
            "status": JobStatus.DONE,
            "answered_by": AnsweredBy.LARGE,
            "final_answer": outcome.answer,
            "scored_answer": outcome.trajectory.scored,
            "trajectory": outcome.trajectory.to_dict(),
            "agent_usage": outcome.trajectory.usage().to_dict(),
            "error_message": None,
        }
    else:
        values = {
            "status": JobStatus.FAILED,
            "error_code": outcome.error_code,
            "error_message": outcome.error,
            # (what the evaluation would still score: Trajectory.conclude's as_reference)
            "scored_answer": outcome.trajectory.scored,
            "trajectory": outcome.trajectory.to_dict(),
            "agent_usage": outcome.trajectory.usage().to_dict(),
        }
    values["finished_at"] = now
    statement = _running_update(Stage.AGENT, tuple(sorted(values)))
    result = session.execute(statement, {"job_id": outcome.job_id, **values})
    cancels.settle(session, [outcome.job_id])
    budgets.check(session, [outcome.job_id])
    webhooks.jobs_ended(session, [outcome.job_id])
    return bool(result.rowcount)  # type: ignore[attr-defined]


def release_orphans(session: Session, live: set[str]) -> dict[Stage, list[str]]:
    """Put running jobs whose worker is not among ``live`` (``live_workers``) back to wait
    for their stage (the claim keeps its attempt: a job that kills its worker must not
    run forever). Returns the released ids by stage."""
    released: dict[Stage, list[str]] = {}
    for stage, waiting in WAITING_FOR.items():
        held = [Job.status == JobStatus.RUNNING, Job.stage == stage, Job.worker.is_not(None)]
        orphan = held + ([Job.worker.not_in(live)] if live else [])
        statement = (
            update(Job)
            .execution_options(synchronize_session=False)
            .where(*orphan)
            .values(status=waiting, worker=None)
            .returning(Job.id)
        )
        released[stage] = list(session.scalars(statement))
    stopped = set(cancels.settle(session, [i for ids in released.values() for i in ids]))
    return {stage: [i for i in ids if i not in stopped] for stage, ids in released.items()}
