"""Routing through phases I-IV on the scripted backend: exact, per job."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from common.backends.scripted import JobScript, ScriptedModel, mixture
from common.config import FunnelSettings, GateSettings
from common.contracts import Accepted, Deferred, Failed, Query
from common.errors import BackendUnavailable, ModelError
from common.pipeline.funnel import prepare_query, run_agent_stage, run_fast_stage
from common.pipeline.isolation import per_job

SCRIPTS = {
    "tools": JobScript(needs_tools=True),
    "sure": JobScript(answer="B", confidence=0.999),
    "unsure": JobScript(answer="C", confidence=0.6),
    "small-breaks": JobScript(fail=frozenset({"speculate"})),
    "screen-breaks": JobScript(fail=frozenset({"screen"})),
    "sure-too": JobScript(answer="D", confidence=0.995),
}


def queries(*job_ids: str) -> list[Query]:
    return [Query(job_id, Image.new("RGB", (64, 64)), "What colour?") for job_id in job_ids]


def test_a_scripted_batch_routes_exactly():
    model = ScriptedModel(SCRIPTS)
    result = run_fast_stage(queries(*SCRIPTS), large=model, small=model, settings=FunnelSettings())
    by_id = {outcome.job_id: outcome for outcome in result.outcomes}
    assert [o.job_id for o in result.outcomes] == list(SCRIPTS)  # order kept
    assert isinstance(by_id["sure"], Accepted) and by_id["sure"].answer == "B"
    assert isinstance(by_id["sure-too"], Accepted) and by_id["sure-too"].answer == "D"
    assert by_id["sure"].confidence == pytest.approx(0.999, abs=1e-6)
    reasons = {
        job_id: outcome.reason for job_id, outcome in by_id.items() if isinstance(outcome, Deferred)
    }
    assert reasons == {
        "tools": "tools_needed",
        "unsure": "low_confidence",
        "small-breaks": "small_model_error",
        "screen-breaks": "screen_error",
    }
    unsure = by_id["unsure"]
    assert isinstance(unsure, Deferred)
    assert unsure.small_answer == "C" and unsure.confidence == pytest.approx(0.6, abs=1e-6)
    assert "small-breaks" in by_id["small-breaks"].detail  # type: ignore[union-attr]


def test_baseline_sends_every_job_to_the_agent_without_calling_a_model():
    model = ScriptedModel(SCRIPTS)
    result = run_fast_stage(
        queries(*SCRIPTS), large=model, small=model, settings=FunnelSettings(baseline=True)
    )
    assert {o.reason for o in result.outcomes if isinstance(o, Deferred)} == {"baseline"}
    assert len(result.outcomes) == len(SCRIPTS) and sum(model.calls.values()) == 0


@pytest.mark.parametrize("screener", ["large", "small", "none"])
def test_the_screener_setting_picks_who_screens(screener: str):
    large, small = ScriptedModel(SCRIPTS), ScriptedModel(SCRIPTS)
    settings = FunnelSettings(screener=screener)  # type: ignore[arg-type]
    result = run_fast_stage(queries("tools", "sure"), large=large, small=small, settings=settings)
    assert large.calls["screen"] == (1 if screener == "large" else 0)
    assert small.calls["screen"] == (1 if screener == "small" else 0)
    assert large.calls["speculate"] == 0
    tools = result.outcomes[0]
    if screener == "none":  # nobody screens: the tool-needing job is speculated too
        assert isinstance(tools, Accepted)
    else:
        assert isinstance(tools, Deferred) and tools.reason == "tools_needed"


def test_the_threshold_moves_jobs_between_routes():
    model = ScriptedModel({"a": JobScript(confidence=0.97), "b": JobScript(confidence=0.99)})
    for threshold, accepted in [(0.96, {"a", "b"}), (0.98, {"b"}), (0.995, set())]:
        settings = FunnelSettings(gate=GateSettings(threshold=threshold))
        result = run_fast_stage(queries("a", "b"), large=model, small=model, settings=settings)
        assert {o.job_id for o in result.outcomes if isinstance(o, Accepted)} == accepted


def test_one_failing_job_does_not_fail_its_batch():
    model = ScriptedModel(SCRIPTS)
    batch = queries("sure", "sure-too", "small-breaks", "unsure")
    results = per_job(lambda items: model.speculate(items, max_new_tokens=5, top_k=64), batch)
    assert [type(r).__name__ for r in results] == [
        "Speculation",
        "Speculation",
        "ModelError",
        "Speculation",
    ]


def test_retryable_errors_are_not_swallowed():
    def unavailable(items: list[int]) -> list[int]:
        raise BackendUnavailable("model server down")

    with pytest.raises(BackendUnavailable):
        per_job(unavailable, [1, 2, 3])


def test_a_backend_answering_the_wrong_count_is_an_error():
    with pytest.raises(ModelError, match="1 results for 2"):
        per_job(lambda items: items[:1], [1, 2])


def test_a_corrupt_image_fails_its_own_job(tmp_path: Path):
    good, bad = tmp_path / "good.png", tmp_path / "bad.png"
    Image.new("RGB", (32, 32)).save(good)
    bad.write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    loaded = [prepare_query(name, str(path), "Q?") for name, path in [("g", good), ("b", bad)]]
    assert isinstance(loaded[0], Query)
    assert isinstance(loaded[1], Failed) and loaded[1].code == "image_error"
    missing = prepare_query("m", str(tmp_path / "missing.png"), "Q?")
    assert isinstance(missing, Failed) and missing.code == "image_missing"


def test_the_agent_stage_answers_or_fails_clearly():
    model = ScriptedModel(
        {
            "answers": JobScript(agent_answer="yes"),
            "rambles": JobScript(agent_steps=("<think>hmm</think>",)),
            "breaks": JobScript(fail=frozenset({"generate"})),
        }
    )
    answers, rambles, breaks = (
        run_agent_stage(q, model) for q in queries("answers", "rambles", "breaks")
    )
    assert answers.answer == "yes" and answers.error_code is None
    assert rambles.answer is None and rambles.error_code == "step_limit"
    assert len(rambles.trajectory.steps) == 6
    assert breaks.answer is None and breaks.error_code == "model_error"


def test_a_mixture_script_hits_its_shares():
    model = ScriptedModel(default=mixture(tool_free=0.7, confident=0.7))
    batch = queries(*(f"job-{i}" for i in range(2000)))
    outcomes = run_fast_stage(batch, large=model, small=model, settings=FunnelSettings()).outcomes
    tool_free = [
        o for o in outcomes if not (isinstance(o, Deferred) and o.reason == "tools_needed")
    ]
    accepted = [o for o in outcomes if isinstance(o, Accepted)]
    assert len(tool_free) / len(outcomes) == pytest.approx(0.7, abs=0.03)
    assert len(accepted) / len(tool_free) == pytest.approx(0.7, abs=0.03)


def test_simulated_costs_are_per_call_plus_per_item():
    from common.backends.scripted import SimulatedCost

    cost = SimulatedCost(fixed_s=0.2, per_item_s=0.01)
    assert cost.seconds(32) == pytest.approx(0.52)
    model = ScriptedModel(costs={"speculate": SimulatedCost()})
    model.speculate(queries("a", "b", "c"), max_new_tokens=5, top_k=64)
    assert model.batch_sizes == [("speculate", 3)]
