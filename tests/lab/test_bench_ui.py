"""``speceyes bench ui``'s seeded batch (consistent as a run leaves it, the same for a
seed) and its page timer, against a stand-in UI on a mock transport."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from common.contracts import AnsweredBy, DeferReason, JobStatus
from common.errors import SpecEyesError
from common.store.tables import Batch, BatchItem, Job
from lab.bench import seeded_batch, ui


def seeded(sessions, tmp_path: Path, seed: int) -> tuple[str, list[tuple[BatchItem, Job]]]:
    batch_id = seeded_batch.seed_batch(sessions, 500, tenant="bench", image_dir=tmp_path, seed=seed)
    with sessions() as session:
        rows = session.execute(
            select(BatchItem, Job)
            .join(Job, Job.id == BatchItem.job_id)
            .where(BatchItem.batch_id == batch_id)
            .order_by(BatchItem.position)
        ).all()
    return batch_id, [(item, job) for item, job in rows]


def drawn(item: BatchItem, job: Job) -> tuple[Any, ...]:
    """What the seed decides (not the ids, keys or clock)."""
    return (
        item.expected,
        item.split,
        job.question,
        job.options,
        job.status,
        job.answered_by,
        job.final_answer,
        job.confidence,
        job.error_code,
        job.audit_agrees,
    )


def test_a_seeded_batch_is_a_consistent_run_of_every_status(sessions, tmp_path: Path):
    batch_id, rows = seeded(sessions, tmp_path, seed=1)
    with sessions() as session:
        assert session.get(Batch, batch_id).tenant == "bench"
        assert session.scalar(select(Job.id).where(Job.tenant != "bench")) is None
    assert [item.position for item, _ in rows] == list(range(500))  # each item has its job
    assert len({job.id for _, job in rows}) == 500
    statuses = Counter(job.status for _, job in rows)
    assert set(statuses) == set(JobStatus) and sum(statuses.values()) == 500
    assert 0.85 < statuses[JobStatus.DONE] / 500 < 0.95
    threshold = seeded_batch.GATE["threshold"]
    for _, job in rows:
        assert Path(job.image_path).is_file()
        if job.answered_by == AnsweredBy.SMALL:  # accepted: the gate's rule, tool-free
            assert job.confidence > threshold and job.screen_needs_tools is False
            assert job.final_answer == job.small_answer and min(job.token_scores) == job.confidence
            assert job.trajectory is None and job.finished_at == job.gated_at
        elif job.answered_by == AnsweredBy.LARGE:  # deferred, then the agent's answer
            assert job.trajectory["answer"] == job.final_answer
            assert job.confidence is None or job.confidence <= threshold
            reason = (
                DeferReason.TOOLS_NEEDED if job.screen_needs_tools else DeferReason.LOW_CONFIDENCE
            )
            assert job.defer_reason == reason
            assert job.created_at < job.gated_at < job.agent_started_at < job.finished_at
        assert (job.status == JobStatus.DONE) == (job.answered_by is not None)
        stopped = job.status in (JobStatus.FAILED, JobStatus.CANCELLED)
        assert stopped == (job.error_code is not None)
        assert (job.audit_status is not None) <= (job.answered_by == AnsweredBy.SMALL)


def test_a_seed_draws_the_same_batch_and_another_seed_another(sessions, tmp_path: Path):
    _, first = seeded(sessions, tmp_path, seed=7)
    _, again = seeded(sessions, tmp_path, seed=7)
    _, other = seeded(sessions, tmp_path, seed=8)
    assert [drawn(*row) for row in first] == [drawn(*row) for row in again]
    assert [drawn(*row) for row in first] != [drawn(*row) for row in other]
    assert {job.id for _, job in first}.isdisjoint(job.id for _, job in again)


def stand_in_ui(request: httpx.Request) -> httpx.Response:
    """The sign-in contract and two pages, one of them failing."""
    path, signed_in = request.url.path, "session=s1" in request.headers.get("cookie", "")
    if path == "/ui/signin" and request.method == "GET":
        form = '<form><input type="hidden" value="t&amp;1" name="csrf"></form>'
        return httpx.Response(200, text=form)
    if path == "/ui/signin":
        assert request.content == b"key=sk-1&csrf=t%261"
        return httpx.Response(303, headers={"set-cookie": "session=s1; Path=/"})
    if not signed_in:
        return httpx.Response(401)
    if path == "/ui/batches/b/results":
        page = '<a href="?after=9&amp;who=small" rel="next">next</a>'
        return httpx.Response(200, text=page, headers={"Server-Timing": "db;dur=3, app;dur=12.5"})
    return httpx.Response(500, text="boom")


def test_pages_are_timed_by_server_timing_after_signing_in_and_a_failing_page_is_loud():
    with httpx.Client(transport=httpx.MockTransport(stand_in_ui), base_url="https://ui") as client:
        assert ui.sign_in(client, "sk-1")
        (timing,) = ui.measure(client, ["/ui/batches/b/results"], repeats=3)
        assert timing == ui.Timing("/ui/batches/b/results", 12.5, 12.5, 12.5, True)
        second = ui.next_page(client, "/ui/batches/b/results")
        assert second == "/ui/batches/b/results?after=9&who=small"
        with pytest.raises(SpecEyesError, match="answered 500"):
            ui.measure(client, ["/ui/batches/b"], repeats=1)


def test_a_server_without_the_ui_is_told_apart():
    with httpx.Client(
        transport=httpx.MockTransport(lambda _: httpx.Response(404)), base_url="https://ui"
    ) as client:
        assert not ui.sign_in(client, "sk-1")
