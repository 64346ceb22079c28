"""What each job cost, kept on it by the stages that ran it, and a batch's figure in
``speceyes report`` (the scripted backend: its calls take the seconds it is told)."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import select

from cli.main import main
from common.contracts import AnsweredBy, Usage
from common.store.db import open_store
from common.store.overview import overview
from common.store.reads import require_batch
from common.store.tables import BatchItem, Job
from tests.helpers.images import write_images


def test_each_job_keeps_what_its_stages_used_and_the_report_says_what_was_saved(
    tmp_path: Path, capsys, monkeypatch
):
    # (a job's draw is by its random id: of 24, about 8 are screened tool-free and then
    # deferred by the gate, the jobs most like the accepted ones; fewer than 2, 1 in 10^4)
    monkeypatch.setenv("SPECEYES_SCRIPTED__TOOL_FREE", "0.7")
    monkeypatch.setenv("SPECEYES_SCRIPTED__CONFIDENT", "0.5")
    monkeypatch.setenv("SPECEYES_SCRIPTED__AGENT_STEP_S", "0.02")
    monkeypatch.setenv("SPECEYES_SCRIPTED__FAST_JOB_S", "0.002")
    monkeypatch.setenv("SPECEYES_ACCOUNTING_PRICE_PER_GPU_HOUR", "3.6")
    write_images(tmp_path / "photos", 24)
    db = f"sqlite:///{tmp_path / 's.db'}"
    flags = ["--backend", "scripted", "--db", db, "--no-progress", "-q", "Is there a dog?"]
    assert main(["annotate", str(tmp_path / "photos"), *flags]) == 0

    sessions = open_store(db, create=False)
    with sessions() as session:
        batch = require_batch(session, "photos")
        jobs = session.scalars(
            select(Job)
            .join(BatchItem, BatchItem.job_id == Job.id)
            .where(BatchItem.batch_id == batch.id)
        ).all()
        ran = [job for job in jobs if job.answered_by == AnsweredBy.LARGE]
        assert len(ran) >= 2 and any(job.answered_by == AnsweredBy.SMALL for job in jobs)
        for job in jobs:
            screened = Usage.of(job.fast_usage)
            assert screened.seconds["screen"] > 0 and screened.tokens_in > 0
            if job.answered_by == AnsweredBy.SMALL:  # speculated and gated; no agent
                assert {"speculate", "gate"} <= set(screened.seconds)
                assert job.agent_usage is None
        for job in ran:  # one scripted step of 0.02 s, counted where it ran
            steps = Usage.of(job.agent_usage)
            assert steps.seconds["agent"] >= 0.02 and steps.tokens_out > 0
            spent = sum(step["model_seconds"] for step in job.trace_steps)  # (0.02 each)
            assert steps.seconds["agent"] == round(spent, 6)
        usage = overview(session, batch.id).usage
    saved = usage.saved()
    like = [job for job in ran if job.screen_needs_tools is False]
    assert saved is not None and saved.basis == "tool_free_runs" and saved.measured == len(like)
    assert saved.low <= saved.seconds <= saved.high and saved.avoided_s > 0
    sessions.close()

    capsys.readouterr()
    assert main(["report", "photos", "--db", db]) == 0
    printed = capsys.readouterr().out
    table = printed[printed.index("model time") :].splitlines()
    at = next(i for i, line in enumerate(table) if line.startswith("batch"))
    header, row = table[at].split(), table[at + 1].split()
    assert header[:4] == ["batch", "model", "s", "tokens"] and header[-2:] == ["saved", "cost"]
    assert row[0] == "photos" and float(row[1]) == round(usage.spent.total_s, 1)
    assert float(row[4]) == round(saved.seconds, 1)  # saved s, then its interval
    assert float(row[-2]) == round(usage.spent.total_s * 0.001, 4)  # 3.6 an hour

    # by day: the command line's jobs (no tenant), today
    assert main(["usage", "--db", db, "--json"]) == 0
    (day,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert day["tenant"] is None and day["jobs"] == 24
    assert day["total_s"] == round(usage.spent.total_s, 3) and "cost" in day
    assert main(["usage", "--db", db, "--tenant", "someone"]) == 0
    assert capsys.readouterr().out.startswith("no jobs finished from")
