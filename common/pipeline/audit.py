"""The online audit: check a sample of accepted answers against the agent while a corpus
runs, and raise an alarm when they stop agreeing.

A tau calibrated on one corpus can be wrong for the next, and nothing in the funnel would
notice: accepted answers never meet the agent. So a share ``audit_rate`` of them (chosen
by a hash of the job's key, so a rerun audits the same jobs) also runs through the agent,
after every deferred job (its own queue, taken last). The accepted answer stays the
job's answer; the audit's answer and whether the two agree are kept beside it.

**Drift.** After each audit, the agreement of the job's batch (audited jobs that agree /
audited) is tested against the baseline, the agreement the calibration run measured
(``--calibration``) or else ``audit.floor``, by a sequential test whose false-alarm
rate holds over all the batch's audits (``common.pipeline.drift``: at most
``audit.level``, 1%, however many audits it takes). When the audits reject the
baseline, the batch's alarm is raised, once: a log line, the
``speceyes_audit_alarms_total`` counter and ``speceyes_audit_drift`` gauge, a field of
``GET /v1/batches/{id}``, a line in ``annotate``'s summary, and the operator's action
(``audit_on_drift``): ``warn``; ``raise-tau``, to the calibration's next stricter step
(or the next one after a raise already made); ``pause``, every new job to the agent.
Both act on the whole deployment (its store) until ``speceyes audit resume``.

Cost: the audit rate x the agent's cost per job, on the slow pool's idle time.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy.orm import Session

from common.config import Settings
from common.config.calibration import CalibrationFile, read_calibration
from common.pipeline.drift import evidence, interval
from common.protocols.scoring import is_correct
from common.store import audits, webhooks
from common.store.tables import Batch, Job, utcnow

log = logging.getLogger(__name__)

EVIDENCE_SHOWN = 1e9  # the most evidence kept (the least level allowed is 1e-6)


def sampled(key: str, rate: float) -> bool:
    """Whether the job with idempotency ``key`` is audited at ``rate`` (stable across runs)."""
    if rate <= 0:
        return False
    draw = int(hashlib.sha256(f"audit:{key}".encode()).hexdigest()[:12], 16) / 16**12
    return draw < rate


@dataclass(frozen=True)
class AuditFigures:
    audited: int
    agreed: int
    low: float  # the agreement's interval, valid at every audit (``drift.interval``)
    high: float
    baseline: float
    evidence: float  # against the baseline (``drift.evidence``); the alarm at 1 / level
    level: float

    @property
    def agreement(self) -> float | None:
        return self.agreed / self.audited if self.audited else None

    @property
    def drifted(self) -> bool:
        return self.audited > 0 and self.evidence >= 1 / self.level

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "agreement": self.agreement, "drifted": self.drifted}


def baseline(settings: Settings) -> float:
    """The agreement the audit expects: the calibration file's, else the floor."""
    found = _calibration(settings)
    return found.agreement if found and found.agreement is not None else settings.audit.floor


def _calibration(settings: Settings) -> CalibrationFile | None:
    path = settings.calibration_file
    return read_calibration(path) if path is not None else None


def figures(session: Session, settings: Settings, batch_id: str | None = None) -> AuditFigures:
    audited, agreed = audits.counts(session, batch_id)
    return figures_of(audited, agreed, settings)


def figures_of(audited: int, agreed: int, settings: Settings) -> AuditFigures:
    """The figures of counts already made (a batch's, ``BatchCounts``)."""
    level, expected = settings.audit.level, baseline(settings)
    low, high = interval(agreed, audited, level)
    against = evidence(agreed, audited - agreed, expected)
    shown = round(min(against, EVIDENCE_SHOWN), 4)  # (JSON has no infinity)
    return AuditFigures(audited, agreed, low, high, expected, shown, level)


def agrees(job: Job, audit_answer: str | None) -> bool | None:
    if audit_answer is None or job.small_answer is None:
        return None
    return is_correct(job.small_answer, audit_answer, job.options)


def check_drift(session: Session, job_id: str, settings: Settings) -> list[dict[str, Any]]:
    """After an audit of ``job_id``: raise the alarm of each of its batches that drifted
    (once per batch) and act on it; returns the alarms raised now."""
    raised = []
    for batch_id in audits.batches_of(session, job_id):
        batch = session.get(Batch, batch_id)
        if batch is None or batch.audit_alarm:
            continue
        found = figures(session, settings, batch_id)
        if not found.drifted:
            continue
        action = _act(session, settings)
        batch.audit_alarm = {**found.as_dict(), "at": utcnow().isoformat(), "action": action}
        webhooks.audit_alarm(session, batch)
        log.error(
            "audit drift in batch %s (%s): %d of %d audited answers agree with the agent "
            "(interval %.3f-%.3f, below %.3f at level %g); action: %s",
            batch.name,
            batch_id,
            found.agreed,
            found.audited,
            found.low,
            found.high,
            found.baseline,
            found.level,
            action,
        )
        raised.append(batch.audit_alarm)
    return raised


def _act(session: Session, settings: Settings) -> str:
    if settings.audit.on_drift == "pause":
        audits.set_control(session, "paused", True)
        return "paused accepting: every new job goes to the agent (speceyes audit resume)"
    if settings.audit.on_drift == "raise-tau":
        current = audits.controls(session).get("gate_threshold", settings.funnel.gate.threshold)
        steps = found.stricter if (found := _calibration(settings)) else []
        stricter = [tau for tau in steps if tau > current]
        if stricter:
            audits.set_control(session, "gate_threshold", stricter[0])
            return f"raised tau from {current:g} to {stricter[0]:g} (speceyes audit resume)"
        audits.set_control(session, "paused", True)
        return "no stricter tau to raise to: paused accepting (speceyes audit resume)"
    return "warned"


def describe(session: Session, settings: Settings, batch: Batch) -> list[str]:
    """The audit of a batch in a few printable lines (none if nothing was audited)."""
    found = figures(session, settings, batch.id)
    waiting = len(audits.unfinished(session, batch.id))
    if not found.audited and not waiting:
        return []
    line = f"audit        {found.agreed} of {found.audited} audited answers agree with the agent"
    if found.audited:
        line += (
            f" ({found.agreement:.1%}; interval {found.low:.2f}-{found.high:.2f} at level "
            f"{found.level:g}, expected >= {found.baseline:.2f})"
        )
    if waiting:
        line += f"; {waiting} audit(s) not run yet"
    lines = [line]
    if batch.audit_alarm:
        alarm = batch.audit_alarm
        lines.append(
            f"DRIFT        alarm raised at {alarm['agreed']} of {alarm['audited']} agreeing "
            f"(below {alarm['baseline']:.2f}): {alarm['action']}"
        )
    return lines
