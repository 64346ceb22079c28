"""The online audit, embedded, with the scripted backend: sampling, drift alarms and the
actions on them, and audits taken only after deferred work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image
from sqlalchemy import select

from common.backends import Models
from common.backends.base import Generation
from common.backends.scripted import JobScript, ScriptedModel
from common.chat import Conversation
from common.config import Settings
from common.pipeline import drift
from common.pipeline.audit import figures_of, sampled
from common.pipeline.runner import EmbeddedRunner
from common.pipeline.submit import submit_corpus
from common.sources.corpus import read_source
from common.store import audits
from common.store.tables import Batch, BatchItem, Job


class Recording(ScriptedModel):
    """The scripted model, keeping the job of each agent generation in order."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.generated: list[str] = []

    def generate(self, conversation: Conversation, **kwargs) -> Generation:
        self.generated.append(str(conversation.key))
        return super().generate(conversation, **kwargs)


def run_corpus(tmp_path: Path, sessions, settings: Settings, scripts, name: str):
    """Annotate ``len(scripts)`` images, each job with its script (in file order)."""
    folder = tmp_path / name
    folder.mkdir()
    for index in range(len(scripts)):  # distinct bytes: distinct jobs
        colour = (index % 256, index // 256, len(name))
        Image.new("RGB", (16, 12), colour).save(folder / f"img{index:04d}.png")
    rows = read_source(folder, f"What is it? ({name})")
    submitted = submit_corpus(sessions, rows, source=str(folder), name=name, settings=settings)
    with sessions() as session:
        jobs = dict(
            session.execute(
                select(BatchItem.position, BatchItem.job_id).where(
                    BatchItem.batch_id == submitted.batch_id
                )
            ).all()
        )
    model = Recording({jobs[i]: script for i, script in enumerate(scripts)})
    EmbeddedRunner(sessions, Models(model, model), settings).run(submitted.batch_id, poll_s=0.05)
    return submitted.batch_id, jobs, model


def alarm(sessions, batch_id: str):
    with sessions() as session:
        return session.get(Batch, batch_id).audit_alarm


def test_sampling_is_stable_and_near_its_rate():
    keys = [f"key-{i}" for i in range(20_000)]
    share = sum(sampled(key, 0.02) for key in keys) / len(keys)
    assert 0.017 < share < 0.023
    assert [sampled(key, 0.02) for key in keys[:500]] == [sampled(k, 0.02) for k in keys[:500]]
    assert not any(sampled(key, 0.0) for key in keys[:500])


def test_a_small_model_that_turns_wrong_halfway_raises_the_alarm_within_the_bound(
    tmp_path: Path, sessions
):
    rate, floor = 0.25, 0.9
    settings = Settings(backend="scripted", audit_rate=rate, audit_floor=floor, fast_batch_size=8)
    half = 120
    scripts = [JobScript(answer="A", agent_answer="A")] * half  # the agent agrees ...
    scripts += [JobScript(answer="A", agent_answer="B")] * half  # ... then contradicts
    batch_id, jobs, _ = run_corpus(tmp_path, sessions, settings, scripts, "drift")
    raised = alarm(sessions, batch_id)
    assert raised is not None and raised["action"] == "warned"
    # the bound, from the rates: the audited jobs of the first half (the sample is fixed
    # by the jobs' keys) can only delay the alarm; with all of them agreeing, it needs d
    # disagreeing audits, d the least with which k agreeing reject the floor
    with sessions() as session:
        keys = audits.keys_of(session, list(jobs.values()))
    agreeing = sum(sampled(keys[jobs[i]], rate) for i in range(half))
    needed = next(d for d in range(1, 500) if drift.drifted(agreeing, agreeing + d, floor, 0.01))
    disagreeing_at_alarm = raised["audited"] - raised["agreed"]
    assert 1 <= disagreeing_at_alarm <= needed, (raised, agreeing, needed)
    assert raised["high"] < floor and raised["evidence"] >= 100  # (1 / level)
    # raised at the first audit that crossed, not later
    assert not drift.drifted(raised["agreed"], raised["audited"] - 1, floor, 0.01)
    with sessions() as session:  # the accepted answers stand; the audits sit beside them
        drifted = [session.get(Job, jobs[i]) for i in range(half, 2 * half)]
        assert {job.final_answer for job in drifted} == {"A"}
        assert {job.audit_answer for job in drifted if job.audit_status == "done"} == {"B"}
        # each audit kept what its run of the agent cost (the accounting's best basis)
        audited = [job for job in drifted if job.audit_status == "done"]
        assert audited and all(job.audit_usage["turns"] for job in audited)
        assert all(job.agent_usage is None for job in audited)  # (the agent never ran it)


def test_one_disagreeing_first_audit_is_no_drift():
    """A 99% interval of 0 agreeing in 1 (0 to 0.87) fell below a floor of 0.9 and raised
    the alarm at the first audit; one audit is not evidence of drift."""
    figures = figures_of(1, 0, Settings(audit_floor=0.9))
    assert figures.high >= 0.9 and not figures.drifted and figures.evidence < 100
    assert figures_of(6, 0, Settings(audit_floor=0.9)).drifted  # (six of six: it is)


def test_no_drift_raises_no_alarm_in_a_thousand_jobs(tmp_path: Path, sessions):
    settings = Settings(backend="scripted", audit_rate=0.1, fast_batch_size=32)
    scripts = [JobScript(answer="A", agent_answer="A")] * 1000
    batch_id, _, _ = run_corpus(tmp_path, sessions, settings, scripts, "steady")
    assert alarm(sessions, batch_id) is None
    with sessions() as session:
        audited, agreed = audits.counts(session, batch_id)
    assert 70 <= audited == agreed <= 130  # about 10% of 1,000, every one agreeing


@pytest.mark.parametrize("action", ["raise-tau", "pause"])
def test_on_drift_the_deployment_raises_tau_or_pauses_until_resumed(
    tmp_path: Path, sessions, action: str
):
    calibration = tmp_path / "calibration.json"  # what `speceyes calibrate --out` writes
    gate = {"mode": "min", "top_k": 64, "threshold": 0.98}
    calibration.write_text(json.dumps({"gate": gate, "stricter": [0.99, 0.995]}))
    settings = Settings(
        backend="scripted",
        audit_rate=1.0,
        audit_floor=0.9,
        audit_on_drift=action,
        calibration_file=calibration,
    )
    wrong = [JobScript(answer="A", confidence=0.999, agent_answer="B")] * 12
    first, _, _ = run_corpus(tmp_path, sessions, settings, wrong, "first")
    assert alarm(sessions, first) is not None
    with sessions() as session:
        controls = audits.controls(session)
    assert controls == ({"gate_threshold": 0.99} if action == "raise-tau" else {"paused": True})
    # the next batch: answers of 0.985 confidence passed tau 0.98; now they do not
    sure_enough = [JobScript(answer="A", confidence=0.985, agent_answer="A")] * 6
    _, jobs, _ = run_corpus(tmp_path, sessions, settings, sure_enough, "second")
    reason = "low_confidence" if action == "raise-tau" else "audit_paused"
    with sessions() as session:
        found = [session.get(Job, job_id) for job_id in jobs.values()]
        assert {(job.answered_by, job.defer_reason) for job in found} == {("large", reason)}
        audits.clear_controls(session)
        session.commit()  # what `speceyes audit resume` does
    _, jobs, _ = run_corpus(tmp_path, sessions, settings, sure_enough, "third")
    with sessions() as session:
        assert {session.get(Job, j).answered_by for j in jobs.values()} == {"small"}


def test_audits_run_only_after_the_deferred_jobs_that_wait_with_them(tmp_path: Path, sessions):
    settings = Settings(backend="scripted", audit_rate=1.0, fast_batch_size=32, agent_workers=1)
    deferred = [JobScript(needs_tools=True, agent_answer="T")] * 6  # first in file order
    accepted = [JobScript(answer="A", agent_answer="A")] * 18  # each audited
    batch_id, jobs, model = run_corpus(tmp_path, sessions, settings, deferred + accepted, "order")
    deferred_ids = {jobs[i] for i in range(6)}
    order = model.generated
    audits_begin = min(i for i, job_id in enumerate(order) if job_id not in deferred_ids)
    assert set(order[:audits_begin]) == deferred_ids  # every deferred job before any audit
    with sessions() as session:
        audited, agreed = audits.counts(session, batch_id)
    assert audited == agreed == 18
