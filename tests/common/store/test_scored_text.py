"""The text the reference scores, where it is not the answer people read: recorded with a
trajectory's end, read by the reference's rules, kept out of ours."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.agents.trajectory import Trajectory
from common.contracts import AgentOutcome, Stage
from common.store import analytics, claims
from common.store.tables import Job
from tests.helpers.reviewing import decided_batch, picture

pytestmark = pytest.mark.unit


def test_the_reference_scores_the_whole_output_and_ours_the_answer(sessions, tmp_path: Path):
    """POPE's rule: an answer as long as the expected word must equal it, any other length
    goes to the judge. "yes" is right by both; the whole output "<answer>yes" is the
    reference's to leave undecided, as the evaluation leaves its pred_answer."""
    rows = [
        {"expected": "yes", "split": "pope/random", "final_answer": "yes"},
        {
            "expected": "yes",
            "split": "pope/random",
            "final_answer": "yes",
            "scored_answer": "<answer>yes",
        },
    ]
    batch_id, _ = decided_batch(sessions, rows, picture(tmp_path))
    with sessions() as session:
        (score,) = analytics.split_scores(session, batch_id)
    assert (score.rows, score.strict_correct) == (2, 2)  # ours: both answers are "yes"
    assert (score.reference_correct, score.undecided) == (1, 1)


def test_a_trajectory_s_scored_text_is_recorded_beside_its_answer(sessions, tmp_path: Path):
    _, (job_id,) = decided_batch(
        sessions, [{"status": "running", "stage": Stage.AGENT}], picture(tmp_path)
    )
    trajectory = Trajectory(answer="B", scored="<think>x</think> <answer> B")
    with sessions.begin() as session:
        assert claims.record_agent(session, AgentOutcome(job_id, "B", trajectory))
    with sessions() as session:
        job = session.get(Job, job_id)
        assert (job.final_answer, job.scored_text) == ("B", "<think>x</think> <answer> B")


def test_a_failed_answer_the_reference_scores_counts_in_its_figure_and_no_other_does(
    sessions, tmp_path: Path
):
    """The evaluation records an empty or tagged answer as its prediction and judges it
    (here: wrong), so its accuracy counts the row; a failure it has as an error too (no
    answer at all) stays out. Ours counts every failed row wrong."""
    rows = [
        {"expected": "yes", "split": "pope/random", "final_answer": "yes"},
        {"expected": "yes", "split": "pope/random", "status": "failed", "scored_answer": ""},
        {"expected": "yes", "split": "pope/random", "status": "failed"},
    ]
    batch_id, _ = decided_batch(sessions, rows, picture(tmp_path))
    with sessions() as session:
        (score,) = analytics.split_scores(session, batch_id)
    assert (score.rows, score.failed, score.failed_scored) == (3, 2, 1)
    assert score.strict == pytest.approx(1 / 3)  # a failed row is wrong
    assert score.reference == pytest.approx(1 / 2)  # 1 right of the 2 it scores


def test_a_failed_trajectory_keeps_the_text_the_reference_scores(sessions, tmp_path: Path):
    _, (job_id,) = decided_batch(
        sessions, [{"status": "running", "stage": Stage.AGENT}], picture(tmp_path)
    )
    trajectory = Trajectory()
    trajectory.conclude("B<think>hm</think>", as_reference=True)
    with sessions.begin() as session:
        assert claims.record_agent(session, AgentOutcome(job_id, None, trajectory))
    with sessions() as session:
        job = session.get(Job, job_id)
        assert (job.status, job.final_answer) == ("failed", None)
        assert job.scored_text == "B<think>hm</think>"


def test_an_audit_runs_the_agent_with_the_image_named_as_the_job_names_it(sessions, tmp_path: Path):
    """An audit re-runs phase IV on an accepted job: for a Thyme benchmark job, with the
    image path the evaluation names (``shown_path``), as the job's own agent would."""
    from common.store import audits

    shown = "./eval_code_thyme/_tmp_hr_images/hr_bench_4k/00000003.jpg"
    _, (job_id,) = decided_batch(
        sessions,
        [{"answered_by": "small", "audit_status": "pending", "shown_path": shown}],
        picture(tmp_path),
    )
    with sessions.begin() as session:
        (ticket,) = audits.claim(session, [job_id])
    assert ticket.shown_path == shown
