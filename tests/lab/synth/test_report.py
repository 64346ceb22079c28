"""The synth report's arithmetic, on made-up outcomes (no model runs)."""

from __future__ import annotations

from pathlib import Path

from lab.synth.report import ItemOutcome, RunFigures, auc, format_report, summarise, sweep
from lab.synth.world import make_item


def outcome(seed: int, difficulty: str, small_right: bool, confidence: float) -> ItemOutcome:
    item = make_item(seed, difficulty=difficulty)
    return ItemOutcome(
        item,
        screen_tool_free=difficulty == "easy",
        small_correct=small_right,
        confidence={mode: confidence for mode in ("min", "mean", "bottom20", "logprob")},
        separability=confidence * 10,
        agent_correct=difficulty == "hard",
        zoom_on_target=True if difficulty == "hard" else None,
    )


OUTCOMES = [
    outcome(1, "easy", True, 0.99),
    outcome(2, "easy", True, 0.95),
    outcome(3, "easy", False, 0.5),
    outcome(4, "hard", False, 0.3),
]


def test_the_sweep_takes_sure_easy_answers_and_leaves_the_rest_to_the_agent():
    rows = {row["tau"]: row for row in sweep(OUTCOMES, fast_s=0.1, agent_s=1.0, taus=[0.9, 0.98])}
    assert rows[0.9]["accepted"] == 0.5 and rows[0.9]["accuracy"] == 0.75
    assert rows[0.98]["accepted"] == 0.25 and rows[0.98]["accuracy"] == 0.5
    assert rows[0.9]["speedup"] == 1.0 / (0.1 + 0.5 * 1.0)


def test_auc_counts_ties_as_half():
    assert auc([2.0, 3.0], [1.0]) == 1.0 and auc([1.0], [1.0]) == 0.5 and auc([0.0], [1.0]) == 0


def test_the_summary_names_the_funnel_runs_threshold(tmp_path: Path):
    run = RunFigures(2.0, 2.0, 0.75, 0.5, 0.5, 0.25, {})
    report = summarise(OUTCOMES, run, run, 0.1, tmp_path / "plot.png", funnel_tau=0.9)
    assert report["funnel"]["tau"] == 0.9 and (tmp_path / "plot.png").stat().st_size > 0
    assert report["separability_mean"]["auc_easy_over_hard"] == 1.0
    text = format_report(report)
    assert "funnel (tau 0.9)" in text and "min       0.98         1" in text
