"""What a batch cost and what the funnel saved, from its jobs' kept usage
(``Job.fast_usage``, ``Job.agent_usage``: ``common.contracts.Usage``).

"Saved" answers: how much less model time did this batch use than running the agent on
every job? The jobs the gate accepted never ran the agent, so what they would have cost
is estimated from the jobs of the same batch that did, less what the fast stage spent
on every job (screening and speculating cost something too).

The best measure is the audit's (``common.pipeline.audit``): it runs the agent on a
random share of the accepted jobs themselves, so where two or more of the batch's were
audited, ``audits`` is the basis: the audited jobs' agent time is known, the rest is
their mean. The audits' own cost is taken off what was saved. Without them, which of
the agent's other jobs are like the accepted ones? Not all of them: an accepted job
was screened tool-free and answered with confidence, the easy kind, and the agent spends
far longer on a job it zooms into (on SpecEyes-Synth, taking every agent-run job's mean
put the saving at 3.3 s where an agent-alone run measured none). So the basis is:

- ``tool_free_runs``: the agent-run jobs the screen also called tool-free (deferred by
  the gate, or a calibration run's), their whole agent time, where there are two;
- ``turn_model``: else, one turn of the agent's, priced by what it reads and writes: a
  turn's seconds fitted as ``a + b * tokens read + c * tokens written`` over every turn
  the agent took in the batch (least squares, by running sums), at a first turn's
  prompt (the image and the question) and an answering turn's length (each run's
  last). A job that needs no tool costs the agent that one turn. The answering turn
  itself is no measure: after a zoom its prompt holds the crop (on SpecEyes-Synth
  0.037 s, against 0.029 s for the agent's only turn on an accepted job).

Its 95% interval is the prediction interval of the accepted jobs' sum: their own spread
(``n * var``) and the mean's uncertainty (``n^2 * var / m``), for ``n`` accepted and
``m`` measured jobs, with Student's t for ``m - 1`` degrees of freedom; and, beside that,
a run's own pace (``RUN_TO_RUN``): what an agent-alone run of the same rows measures is
another run, and two runs of the same work on one machine differ by a few percent. It
holds what the agent would have spent as far as the basis is like the accepted jobs;
``tests/cli/test_saved.py`` checks it against an agent-alone run of the same rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from common.contracts import AnsweredBy, Phase, Usage
from common.store.db import is_postgres
from common.store.expressions import ModelSeconds
from common.store.tables import Job, as_utc

Z_95 = 1.959964  # the normal quantile of a two-sided 95% interval
_T_95_FEW = {1: 12.706205, 2: 4.302653}  # Student's t for 1 and 2 degrees of freedom
MIN_MEASURED = 2  # agent-run jobs needed before a spread, and so a "saved", is known
# A whole run's model time, run to run, on one machine (relative standard deviation):
# four agent-alone runs of the same SpecEyes-Synth rows spread by 2.6% and 4.7%
# (docs/benchmarks.md). An agent-alone run's time is one such run, not this batch's.
RUN_TO_RUN = 0.05


@dataclass
class BatchUsage:
    """A batch's jobs' usage summed, and the agent's time per job it ran."""

    jobs: int = 0  # jobs with a usage record
    spent: Usage = field(default_factory=Usage)
    accepted: int = 0  # answered by the small model: the agent never ran them
    agent_runs: list[float] = field(default_factory=list)  # each agent-run job's seconds
    per_job: list[float] = field(default_factory=list)  # each job's seconds, both stages
    tool_free_runs: list[float] = field(default_factory=list)  # those screened tool-free
    audit_runs: list[float] = field(default_factory=list)  # accepted jobs' audits: the agent
    turn_cost: TurnCost = field(default_factory=lambda: TurnCost())

    def add(
        self,
        fast: Any,
        agent: Any,
        answered_by: str | None,
        needs_tools: bool | None = None,
        audit: Any = None,
    ) -> None:
        """One job's records (as stored: anything unreadable counts as nothing) and what
        its screen said."""
        if fast is None and agent is None and audit is None:
            return
        self.jobs += 1
        screened = Usage.of(fast)
        self.spent.merge(screened)
        spent = screened.total_s
        if agent is not None:
            ran = Usage.of(agent)
            self.spent.merge(ran)
            self.agent_runs.append(ran.total_s)
            if needs_tools is False:
                self.tool_free_runs.append(ran.total_s)
            self.turn_cost.add_run(ran.turns)
            spent += ran.total_s
        if audit is not None:
            audited = Usage.of(audit)
            self.spent.add(Phase.AUDIT, audited.total_s, audited.tokens_in, audited.tokens_out)
            self.audit_runs.append(audited.total_s)
            spent += audited.total_s
        self.per_job.append(spent)
        if answered_by == AnsweredBy.SMALL:
            self.accepted += 1

    @property
    def fast_s(self) -> float:
        return sum(self.spent.seconds.get(phase, 0.0) for phase in _FAST)

    @property
    def agent_mean_s(self) -> float | None:
        runs = self.agent_runs
        return sum(runs) / len(runs) if runs else None

    def saved(self) -> Saved | None:
        """What the funnel saved against the agent alone, or None while fewer than
        ``MIN_MEASURED`` of the batch's jobs ran the agent."""
        accepted, like, known = self.accepted, self.tool_free_runs, 0.0
        audits = self.audit_runs
        if len(audits) >= MIN_MEASURED and accepted >= len(audits):
            mean = sum(audits) / len(audits)
            variance = sum((run - mean) ** 2 for run in audits) / (len(audits) - 1)
            rest = accepted - len(audits)  # (the audited ones' time is known)
            spread = rest * variance + rest**2 * variance / len(audits)
            measured, freedom, basis = len(audits), len(audits) - 1, "audits"
            known, accepted = sum(audits), rest
        elif len(like) >= MIN_MEASURED:
            mean = sum(like) / len(like)
            variance = sum((run - mean) ** 2 for run in like) / (len(like) - 1)
            # (the accepted jobs' own spread, and the mean's)
            spread = accepted * variance + accepted**2 * variance / len(like)
            measured, freedom, basis = len(like), len(like) - 1, "tool_free_runs"
        else:
            fitted = self.turn_cost.predict()
            if fitted is None:
                return None
            mean, variance, of_mean, freedom = fitted
            spread = accepted * variance + accepted**2 * of_mean
            measured, basis = self.turn_cost.runs, "turn_model"
        avoided = known + accepted * mean
        # (the sampling's part, and a run's own pace: two runs of the same rows differ)
        half = math.hypot(t_95(freedom) * math.sqrt(spread), Z_95 * RUN_TO_RUN * avoided)
        seconds = avoided - self.fast_s - sum(audits)  # (an audit is compute spent too)
        alone = sum(self.agent_runs) + avoided  # the agent on every job ran or accepted
        low = max(seconds - half, -self.fast_s - sum(audits))  # (at worst, nothing avoided)
        return Saved(seconds, low, seconds + half, avoided, alone, measured, self.accepted, basis)

    def to_dict(self, price_per_gpu_hour: float | None = None) -> dict[str, Any]:
        """As the API, the report and the export show it (money only with a price)."""
        saved = self.saved()
        shown: dict[str, Any] = {
            "jobs": self.jobs,
            "seconds": {phase: round(s, 3) for phase, s in sorted(self.spent.seconds.items())},
            "total_s": round(self.spent.total_s, 3),
            "tokens_in": self.spent.tokens_in,
            "tokens_out": self.spent.tokens_out,
            "accepted": self.accepted,
            "agent_mean_s": _rounded(self.agent_mean_s),
            "saved": None if saved is None else saved.to_dict(),
        }
        if price_per_gpu_hour is not None:
            hours = 1 / 3600 * price_per_gpu_hour
            shown["cost"] = round(self.spent.total_s * hours, 4)
            shown["saved_cost"] = None if saved is None else round(saved.seconds * hours, 4)
        return shown


@dataclass
class TurnCost:
    """The agent's turns in a batch, for a least-squares fit of a turn's seconds on its
    tokens read and written (``a + b * read + c * wrote``), kept as running sums."""

    runs: int = 0
    turns: int = 0
    xtx: list[list[float]] = field(default_factory=lambda: [[0.0] * 3 for _ in range(3)])
    xty: list[float] = field(default_factory=lambda: [0.0] * 3)
    yty: float = 0.0
    first_read: float = 0.0  # summed over runs: the prompt of a first turn
    last_wrote: float = 0.0  # summed over runs: an answering turn's length

    def add_run(self, turns: list[tuple[int, int, float]]) -> None:
        if not turns:
            return
        self.runs += 1
        self.first_read += turns[0][0]
        self.last_wrote += turns[-1][1]
        for read, wrote, seconds in turns:
            row = (1.0, float(read), float(wrote))
            self.turns += 1
            self.yty += seconds * seconds
            for i in range(3):
                self.xty[i] += row[i] * seconds
                for j in range(3):
                    self.xtx[i][j] += row[i] * row[j]

    def predict(self) -> tuple[float, float, float, int] | None:
        """One no-tool turn's expected seconds, a turn's residual variance, the variance
        of that expectation, and the fit's degrees of freedom; None where the turns do
        not determine the fit (fewer than ``MIN_MEASURED`` runs, or too alike)."""
        freedom = self.turns - 3
        if self.runs < MIN_MEASURED or freedom < 1:
            return None
        xtx, xty = numpy.array(self.xtx), numpy.array(self.xty)
        if numpy.linalg.matrix_rank(xtx) < 3:
            return None
        inverse = numpy.linalg.inv(xtx)
        beta = inverse @ xty
        residual = max(0.0, self.yty - float(beta @ xty)) / freedom
        at = numpy.array([1.0, self.first_read / self.runs, self.last_wrote / self.runs])
        mean = max(0.0, float(at @ beta))
        return mean, residual, residual * float(at @ inverse @ at), freedom


@dataclass(frozen=True)
class Projection:
    """A sum over a whole corpus projected from a random sample of its rows, with its
    95% prediction interval (``project``)."""

    value: float
    low: float
    high: float


def project(sample: list[float], population: int) -> Projection | None:
    """The sum over ``population`` rows of a figure measured on ``sample`` (a simple
    random sample of them): the sample's own sum, and the rest at the sample's mean,
    whose spread is the rest's (``r * var``) and the mean's (``r^2 * var / n``), for
    ``r`` rows not sampled. None with fewer than two measured."""
    n = len(sample)
    if n < MIN_MEASURED:
        return None
    rest = max(0, population - n)
    mean = sum(sample) / n
    variance = sum((x - mean) ** 2 for x in sample) / (n - 1)
    value = sum(sample) + rest * mean
    half = t_95(n - 1) * math.sqrt(rest * variance + rest**2 * variance / n)
    return Projection(value, max(sum(sample), value - half), value + half)  # (spent already)


@dataclass(frozen=True)
class Saved:
    """The funnel's saving in model seconds, with its 95% interval."""

    seconds: float  # the agent time avoided, less the fast stage's
    low: float
    high: float
    avoided_s: float  # the accepted jobs' estimated agent time
    agent_alone_s: float  # the estimate of the agent on every job
    measured: int  # the agent-run jobs its mean and spread come from
    accepted: int  # the jobs the agent never ran
    basis: str  # "audits", "tool_free_runs" or "turn_model" (the module's docstring)

    @property
    def per_job_s(self) -> float:
        """What one accepted job would have cost the agent, by the basis."""
        return self.avoided_s / self.accepted if self.accepted else 0.0

    @property
    def share(self) -> float | None:
        """Of the agent-alone cost."""
        return self.seconds / self.agent_alone_s if self.agent_alone_s > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 3),
            "low": round(self.low, 3),
            "high": round(self.high, 3),
            "share": _rounded(self.share, 4),
            "avoided_s": round(self.avoided_s, 3),
            "per_job_s": round(self.per_job_s, 4),
            "agent_alone_s": round(self.agent_alone_s, 3),
            "measured_jobs": self.measured,
            "basis": self.basis,
        }


_FAST = (Phase.SCREEN, Phase.SPECULATE, Phase.GATE)


def t_95(freedom: int) -> float:
    """Student's t quantile of a two-sided 95% interval: the table's for 1 and 2 degrees
    of freedom, Fisher's expansion in ``1 / freedom`` from 3 (within 1% there, closer
    beyond)."""
    if freedom < 3:
        return _T_95_FEW[max(1, freedom)]
    z, v = Z_95, float(freedom)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
    )


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


@dataclass
class DayUsage:
    """One tenant's jobs finished on one day (UTC), and what they used."""

    day: str  # YYYY-MM-DD
    tenant: str | None  # None: the command line's
    jobs: int = 0
    spent: Usage = field(default_factory=Usage)

    def to_dict(self, price_per_gpu_hour: float | None = None) -> dict[str, Any]:
        shown = {
            "day": self.day,
            "tenant": self.tenant,
            "jobs": self.jobs,
            "seconds": {phase: round(s, 3) for phase, s in sorted(self.spent.seconds.items())},
            "total_s": round(self.spent.total_s, 3),
            "tokens_in": self.spent.tokens_in,
            "tokens_out": self.spent.tokens_out,
        }
        if price_per_gpu_hour is not None:
            shown["cost"] = round(self.spent.total_s / 3600 * price_per_gpu_hour, 4)
        return shown


EVERY_TENANT = object()  # ``by_day``'s tenant: all of them (an admin's read)


def by_day(
    session: Session, tenant: str | object | None, start: datetime, end: datetime
) -> list[DayUsage]:
    """The jobs finished in [``start``, ``end``) of ``tenant`` (or ``EVERY_TENANT``), by
    day and tenant, oldest first: a pass over those jobs' usage records (by
    ``ix_jobs_tenant_finished`` for one tenant, ``ix_jobs_finished`` for the command
    line's jobs, which have none)."""
    query = select(
        Job.tenant, Job.finished_at, Job.fast_usage, Job.agent_usage, Job.audit_usage
    ).where(Job.finished_at >= start, Job.finished_at < end)
    if tenant is not EVERY_TENANT:
        query = query.where(Job.tenant.is_(None) if tenant is None else Job.tenant == tenant)
    days: dict[tuple[str, str | None], DayUsage] = {}
    for owner, finished, fast, agent, audit in session.execute(
        query.execution_options(yield_per=2000)
    ):
        day = as_utc(finished).date().isoformat()
        found = days.setdefault((day, owner), DayUsage(day, owner))
        found.jobs += 1
        found.spent.merge(Usage.of(fast))
        found.spent.merge(Usage.of(agent))
        if audit is not None:  # (counted on the day its job finished)
            audited = Usage.of(audit)
            found.spent.add(Phase.AUDIT, audited.total_s, audited.tokens_in, audited.tokens_out)
    return [days[key] for key in sorted(days, key=lambda key: (key[0], key[1] or ""))]


def day_of(moment: datetime) -> tuple[datetime, datetime]:
    """The UTC day ``moment`` falls in: its start and the next day's (what a daily quota
    counts, and when it fills again)."""
    start = as_utc(moment).replace(hour=0, minute=0, second=0, microsecond=0)
    return start, start + timedelta(days=1)


def jobs_made_since(session: Session, tenant: str, start: datetime) -> int:
    """The tenant's jobs created at or after ``start`` (by ``ix_jobs_tenant_created``)."""
    query = select(func.count()).where(Job.tenant == tenant, Job.created_at >= start)
    return session.scalar(query) or 0


def seconds_since(session: Session, tenant: str, start: datetime) -> float:
    """The model seconds of the tenant's jobs that finished at or after ``start``: summed
    in SQL (``ModelSeconds``), over ``ix_jobs_tenant_finished``'s rows."""
    query = select(func.sum(ModelSeconds())).where(Job.tenant == tenant, Job.finished_at >= start)
    return float(session.scalar(query) or 0.0)


def lock_tenant(session: Session, tenant: str) -> None:
    """Hold the tenant's quota lock to the end of the transaction (PostgreSQL; SQLite has
    one writer at a time already): two submissions of one tenant are checked one after
    the other, each seeing the other's jobs."""
    if is_postgres(session):
        session.execute(
            text("SELECT pg_advisory_xact_lock(:space, hashtext(:tenant))"),
            {"space": QUOTA_LOCK, "tenant": tenant},
        )


QUOTA_LOCK = 50  # the advisory locks' key space of the quota checks (its other key: the tenant)
