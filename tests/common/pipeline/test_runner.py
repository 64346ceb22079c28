"""The embedded runner end to end: scripted for exact routes, tiny models for real paths."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import select

import common.pipeline.runner as runner_module
from common.backends import Models
from common.backends.scripted import JobScript, ScriptedModel, SimulatedCost
from common.config import Settings
from common.images import content_hash
from common.pipeline.runner import EmbeddedRunner
from common.pipeline.submit import submit_corpus
from common.sources.corpus import read_source
from common.store import submission
from common.store.new_jobs import NewItem
from common.store.tables import BatchItem, Job
from tests.helpers.images import write_images
from tests.helpers.routes import ROUTES
from tests.helpers.waiting import wait_until


def corpus(tmp_path: Path, settings: Settings, sessions) -> str:
    folder = tmp_path / "corpus"
    write_images(folder, len(ROUTES))
    (folder / "img010.png").write_bytes(b"\x89PNG\r\n\x1a\nbroken")  # corrupt: fails alone
    rows = read_source(folder, "What is it?")
    submitted = submit_corpus(sessions, rows, source=str(folder), name="t", settings=settings)
    return submitted.batch_id


def scripted_for(sessions, batch_id: str, **costs) -> ScriptedModel:
    with sessions() as session:
        rows = session.execute(
            select(BatchItem.item_id, BatchItem.job_id).where(BatchItem.batch_id == batch_id)
        )
        scripts = {job_id: ROUTES[item] for item, job_id in rows if item in ROUTES}
    return ScriptedModel(scripts, costs=costs)


def test_a_scripted_corpus_takes_exactly_its_routes(tmp_path: Path, sessions):
    settings = Settings(backend="scripted", fast_batch_size=4, agent_max_steps=3)
    batch_id = corpus(tmp_path, settings, sessions)
    model = scripted_for(sessions, batch_id)
    result = EmbeddedRunner(sessions, Models(model, model), settings).run(batch_id, poll_s=0.05)
    counts = result.counts
    assert counts.jobs == 11 and result.finished_now == 11 and not result.interrupted
    assert counts.by_answerer == {"small": 4, "large": 5}
    assert counts.failures == {"step_limit": 1, "image_error": 1}
    assert counts.by_defer_reason == {"tools_needed": 4, "low_confidence": 2}
    assert counts.beta == pytest.approx(6 / 10) and counts.alpha == pytest.approx(4 / 6)
    with sessions() as session:
        answers = {
            item: (job.final_answer, job.answered_by)
            for item, job in session.execute(
                select(BatchItem.item_id, Job).join(Job, Job.id == BatchItem.job_id)
            )
        }
    assert answers["img003.png"] == ("S3", "small") and answers["img007.png"] == ("U7", "large")
    assert answers["img000.png"] == ("T0", "large") and answers["img009.png"] == (None, None)
    # micro-batches of at most 4 (the first one halved: common.pipeline.work.unit.halves),
    # more than one job at a time; the corrupt image never reached a model
    assert 1 < max(size for phase, size in model.batch_sizes if phase == "screen") <= 4
    assert sum(size for phase, size in model.batch_sizes if phase == "screen") == 10


def test_the_agent_stage_runs_while_the_fast_stage_still_works(tmp_path: Path, sessions):
    settings = Settings(backend="scripted", fast_batch_size=2, agent_max_steps=3)
    batch_id = corpus(tmp_path, settings, sessions)
    model = scripted_for(
        sessions, batch_id, screen=SimulatedCost(0.15), generate=SimulatedCost(0.2)
    )
    EmbeddedRunner(sessions, Models(model, model), settings).run(batch_id, poll_s=0.05)
    with sessions() as session:
        jobs = list(session.scalars(select(Job)))
    last_gated = max(job.gated_at for job in jobs if job.gated_at)
    first_agent = min(job.agent_started_at for job in jobs if job.agent_started_at)
    assert first_agent < last_gated  # a trajectory began before the last fast batch ended


def test_a_rerun_does_not_redo_finished_jobs(tmp_path: Path, sessions):
    settings = Settings(backend="scripted", agent_max_steps=2)
    batch_id = corpus(tmp_path, settings, sessions)
    model = scripted_for(sessions, batch_id)
    EmbeddedRunner(sessions, Models(model, model), settings).run(batch_id, poll_s=0.05)
    calls = sum(model.calls.values())
    again = EmbeddedRunner(sessions, Models(model, model), settings).run(batch_id, poll_s=0.05)
    assert again.finished_now == 0 and sum(model.calls.values()) == calls


def test_an_interrupt_during_a_claim_leaves_nothing_claimed(tmp_path: Path, sessions, monkeypatch):
    """Ctrl-C lands while the fast stage is claiming: the claim finishes first and is put
    back, so the process can exit at once with no job left ``running``."""
    settings = Settings(backend="scripted", fast_batch_size=4)
    batch_id = corpus(tmp_path, settings, sessions)
    model = scripted_for(sessions, batch_id)
    runner = EmbeddedRunner(sessions, Models(model, model), settings)
    claiming, go = threading.Event(), threading.Event()
    real_claim = runner_module.claims.claim

    def slow_claim(*args, **kwargs):
        claiming.set()
        go.wait(timeout=30)
        return real_claim(*args, **kwargs)

    monkeypatch.setattr(runner_module.claims, "claim", slow_claim)
    monkeypatch.setattr(
        runner, "fast", SimpleNamespace(run=lambda tickets: None)
    )  # records nothing
    fast = runner._thread("fast-stage", runner._fast_loop, batch_id)
    assert claiming.wait(timeout=30)
    interrupt = threading.Thread(target=runner._interrupt, args=(batch_id,))
    interrupt.start()
    interrupt.join(timeout=0.5)  # a window in which an unguarded release would finish
    go.set()
    interrupt.join(timeout=30)
    fast.join(timeout=30)
    assert not interrupt.is_alive() and not fast.is_alive()
    with sessions() as session:
        statuses = set(session.scalars(select(Job.status)))
    assert statuses == {"queued"}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_tiny_checkpoints_run_end_to_end(tmp_path: Path, sessions, tiny_large, tiny_small):
    settings = Settings(
        small_model="tiny",
        large_model="tiny",
        agent_max_steps=1,
        agent_max_new_tokens=16,
        screener="none",
    )
    folder = tmp_path / "corpus"
    write_images(folder, 3, size=(120, 90))
    rows = read_source(folder, "What colour is it?", ["red", "blue"])
    batch_id = submit_corpus(
        sessions, rows, source=str(folder), name="t", settings=settings
    ).batch_id
    result = EmbeddedRunner(sessions, Models(tiny_large, tiny_small), settings).run(
        batch_id, poll_s=0.05
    )
    assert result.counts.finished == 3 and not result.interrupted
    with sessions() as session:
        for job in session.scalars(select(Job)):
            assert job.small_answer is not None and job.confidence is not None  # speculated
            assert job.status == "done" or job.error_code == "step_limit"
            if job.answered_by == "large" or job.error_code == "step_limit":
                assert len(job.trajectory["steps"]) == 1


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_poison_job_fails_alone_after_its_attempts(tmp_path: Path, sessions):
    """The embedded runner shares the work unit of the workers: a job whose record fails
    (PostgreSQL refuses a NUL in text) is split out of its batch, retried, then failed;
    the others are charged no attempt for it."""
    settings = Settings(backend="scripted", fast_batch_size=4, retry_delay_s=0.05)
    folder = tmp_path / "corpus"
    write_images(folder, 4)
    rows = read_source(folder, "What is it?")
    batch_id = submit_corpus(
        sessions, rows, source=str(folder), name="t", settings=settings
    ).batch_id
    with sessions() as session:
        items = dict(session.execute(select(BatchItem.item_id, BatchItem.job_id)).all())
    scripts = {job_id: JobScript(answer="fine") for job_id in items.values()}
    scripts[items["img002.png"]] = JobScript(answer="bad\x00answer")
    model = ScriptedModel(scripts)

    result = EmbeddedRunner(sessions, Models(model, model), settings).run(batch_id, poll_s=0.05)

    assert result.counts.by_answerer == {"small": 3} and result.counts.failures == {
        "internal_error": 1
    }
    with sessions() as session:
        poison = session.get(Job, items["img002.png"])
        others = [session.get(Job, i) for name, i in items.items() if name != "img002.png"]
    assert poison.attempts == settings.recovery.max_attempts
    assert "NUL" in (poison.error_message or "")
    # its batch-mates were split from it, not failed with it: each ran once, uncharged
    assert [job.attempts for job in others] == [1, 1, 1]


def test_a_thread_that_outruns_the_wait_is_named_and_not_waited_for_twice(
    tmp_path: Path, sessions, monkeypatch
):
    """The interrupt waits DRAIN_S once for the stage threads; a close() after it (the
    command's cleanup) does not wait again, and the thread still running is named."""
    settings = Settings(backend="scripted")
    model = ScriptedModel({})
    runner = EmbeddedRunner(sessions, Models(model, model), settings)
    release = threading.Event()
    monkeypatch.setattr(runner_module, "DRAIN_S", 0.2)
    runner._thread("fast-stage", lambda _: release.wait(30), None)  # deaf to stop()
    runner._end_threads()
    assert runner.lingering() == ["fast-stage"]
    monkeypatch.setattr(runner_module, "DRAIN_S", 60.0)
    closing = threading.Thread(target=runner.close)
    closing.start()
    closing.join(timeout=10)
    assert not closing.is_alive()  # it did not wait the 60 s again
    release.set()
    wait_until(lambda: not runner.lingering(), deadline_s=10, what="the thread to end")


def test_a_single_high_job_overtakes_a_queued_corpus(tmp_path: Path, sessions):
    """Sent after 40 corpus jobs wait, each micro-batch costing 0.2 s: it is taken by the
    next claim, long before the corpus ends."""
    settings = Settings(backend="scripted", fast_batch_size=4)
    write_images(tmp_path / "corpus", 40)
    rows = read_source(tmp_path / "corpus", "What is it?")
    batch_id = submit_corpus(
        sessions, rows, source=str(tmp_path / "corpus"), name="t", settings=settings
    ).batch_id
    write_images(tmp_path / "single", 41)  # (the 41st image: no corpus job has it)
    single = tmp_path / "single" / "img040.png"
    item = NewItem(0, "alone", "What is it?", image_path=str(single), priority=0)
    with sessions.begin() as session:
        job_id = submission.submit_job(
            session,
            replace(item, image_hash=content_hash(single.read_bytes())),
            client_key=None,
            batch_id=None,
        ).id
    model = ScriptedModel(costs={"screen": SimulatedCost(0.2)})
    runner = EmbeddedRunner(sessions, Models(model, model), settings)
    runner.serve()
    try:

        def status() -> str:
            with sessions() as session:
                return session.get(Job, job_id).status

        wait_until(lambda: status() == "done", deadline_s=60, what="the single job")
        now = runner.counts(batch_id)
        assert now.jobs - now.finished >= 30, now  # at most a micro-batch ran before it
    finally:
        runner.stop()
        runner.close()
