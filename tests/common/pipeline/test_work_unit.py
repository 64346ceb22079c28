"""What both stages share (``common.pipeline.work.unit``): the report's sums, the pixel
groups at their edges, the first batch's halves, the time a transaction took, how a
retry is logged, the staleness of a held job, and a job failed for good."""

from __future__ import annotations

import logging
import time

from common.contracts import Ticket
from common.errors import BackendUnavailable, Interrupted
from common.pipeline.work.unit import (
    StageReport,
    halves,
    log_retry,
    pixel_groups,
    record_spent,
)
from tests.helpers.images import write_images
from tests.helpers.work import jobs, running_since, stage, submit


def test_a_report_starts_at_nothing_and_merges_by_adding():
    report = StageReport()
    assert (report.failed, report.skipped, report.cancelled, report.seconds) == (0, 0, 0, {})
    report.merge(StageReport(failed=1, skipped=2, cancelled=3, seconds={"screen": 1.5}))
    report.merge(StageReport(failed=1, cancelled=1, seconds={"screen": 0.5, "load": 0.25}))
    assert (report.failed, report.skipped, report.cancelled) == (2, 2, 4)
    assert report.seconds == {"screen": 2.0, "load": 0.25}


def test_pixel_groups_fill_to_the_budget_exactly_and_a_pathless_job_weighs_nothing(tmp_path):
    paths = write_images(tmp_path, 4, size=(100, 100))  # 10,000 pixels each
    tickets = [Ticket(f"j{i}", str(path), None, "Q?", None) for i, path in enumerate(paths)]
    exact = pixel_groups(tickets, budget=20_000)
    assert [[t.job_id for t in group] for group in exact] == [["j0", "j1"], ["j2", "j3"]]
    pathless = Ticket("none", None, None, "Q?", None)
    (dot,) = write_images(tmp_path / "dot", 1, size=(1, 1))  # one pixel: just over
    tiny = Ticket("tiny", str(dot), None, "Q?", None)
    grouped = pixel_groups([tickets[0], pathless, tiny], budget=10_000)
    assert [[t.job_id for t in group] for group in grouped] == [["j0", "none"], ["tiny"]]
    full = pixel_groups([*tickets[:2], tiny], budget=20_000)
    assert [[t.job_id for t in group] for group in full] == [["j0", "j1"], ["tiny"]]


def test_a_first_batch_is_halved_its_first_half_the_smaller():
    assert halves([1, 2, 3, 4, 5]) == [[1, 2], [3, 4, 5]]
    assert halves([1, 2]) == [[1], [2]]
    assert halves([1]) == [[1]]


def test_a_transactions_time_is_split_between_recording_and_sending():
    spent = {"record": 0.0, "send": 0.0}
    record_spent(spent, time.perf_counter() - 2.0, sent_s=0.5)  # began 2 s ago
    assert spent["send"] == 0.5 and 1.5 <= spent["record"] < 1.9


def test_a_retry_is_news_unless_the_process_is_stopping(caplog):
    with caplog.at_level(logging.INFO, logger="common.pipeline.work.unit"):
        log_retry(BackendUnavailable("down"), "retry %s", "a")
        log_retry(Interrupted("stopping"), "retry %s", "b")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "retry a"),
        (logging.INFO, "retry b"),
    ]


def test_a_held_job_is_stale_after_half_the_visibility_timeout(sessions, tmp_path):
    ids = submit(sessions, tmp_path, 2)
    fast, _ = stage(sessions, {})  # visibility_timeout_s=60: stale after 30 s
    running_since(sessions, ids[0], 25)
    running_since(sessions, ids[1], 35)
    claimed = fast._claim_named(ids, takeover=False)
    assert [ticket.job_id for ticket in claimed] == [ids[1]]


def test_a_job_that_fails_for_good_is_counted_once_with_its_reason_cut(sessions, tmp_path, caplog):
    ids = submit(sessions, tmp_path, 1)
    fast, _ = stage(sessions, {}, max_attempts=1)

    def broken(group, on_screened=None, meter=None):
        raise RuntimeError("x" * 5000)

    fast._compute = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="speceyes.jobs"):
        report = fast.run_ids(ids)
    assert report.failed == 1
    job = jobs(sessions)[ids[0]]
    assert job.status == "failed" and len(job.error_message) == 2000
    assert job.error_message.startswith("RuntimeError: xxx")
    (logged,) = [r for r in caplog.records if r.name == "speceyes.jobs"]
    assert len(logged.fields["reason"]) == 2000


def test_a_job_over_its_attempts_is_counted_failed_once(sessions, tmp_path):
    from sqlalchemy import update

    from common.store.tables import Job

    ids = submit(sessions, tmp_path, 1)
    fast, _ = stage(sessions, {}, max_attempts=1)
    running_since(sessions, ids[0], 45)
    with sessions.begin() as session:
        session.execute(update(Job).where(Job.id == ids[0]).values(attempts=1))
    report = fast.run_ids(ids)
    assert report.failed == 1 and jobs(sessions)[ids[0]].error_code == "attempts_exhausted"
