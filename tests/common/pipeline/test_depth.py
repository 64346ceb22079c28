"""Speculation in depth (``common.pipeline.depth``) on the scripted backend: the small
model's zooms in lockstep, what each turn leads to, and what hostile turns can cost."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from common.backends.base import Generation, answer_scores
from common.backends.scripted import JobScript, ScriptedModel
from common.config import FunnelSettings
from common.contracts import Accepted, DeferReason, Deferred, Query
from common.images import ResizeRule
from common.pipeline.depth import speculate_in_depth
from common.pipeline.funnel import run_fast_stage
from common.scores import TokenScores


def zoom(box: list[float] | str) -> str:
    arguments = {"bbox_2d": box}
    call = {"name": "image_zoom_in_tool", "arguments": arguments}
    return f"<think>closer</think><tool_call>{json.dumps(call)}</tool_call>"


ANSWER = "<think>seen</think><answer>B</answer>"
SCRIPTS = {
    "at-once": JobScript(answer="A"),
    "one-zoom": JobScript(zoom_steps=(zoom([10, 10, 40, 40]), ANSWER)),
    "two-zooms": JobScript(zoom_steps=(zoom([0, 0, 30, 30]), zoom([5, 5, 25, 25]), ANSWER)),
    "never-answers": JobScript(zoom_steps=(zoom([10, 10, 40, 40]),)),
    "tools": JobScript(needs_tools=True, zoom_steps=(zoom([10, 10, 40, 40]), ANSWER)),
    "unsure": JobScript(confidence=0.6, zoom_steps=(zoom([10, 10, 40, 40]), ANSWER)),
}


def queries(*job_ids: str, size: tuple[int, int] = (64, 64)) -> list[Query]:
    return [Query(job_id, Image.new("RGB", size), "What is it?") for job_id in job_ids]


def fast(model: ScriptedModel, job_ids: tuple[str, ...], **settings) -> dict[str, object]:
    result = run_fast_stage(
        queries(*job_ids), large=model, small=model, settings=FunnelSettings(**settings)
    )
    return {outcome.job_id: outcome for outcome in result.outcomes}


def test_depth_zero_is_the_paper_no_zoom_is_asked_for():
    model = ScriptedModel(SCRIPTS)
    outcomes = fast(model, ("at-once", "one-zoom", "tools"))
    assert model.calls["zoom"] == 0 and model.calls["speculate"] == 1
    assert isinstance(outcomes["one-zoom"], Accepted) and outcomes["one-zoom"].zoom_steps == ()
    assert isinstance(outcomes["tools"], Deferred)


def test_the_zooms_of_a_batch_run_in_lockstep_one_call_a_round():
    model = ScriptedModel(SCRIPTS)
    outcomes = fast(model, ("at-once", "one-zoom", "two-zooms"), speculation_depth=2)
    # round 1: all three; round 2: the two still zooming; round 3: the last
    assert [size for phase, size in model.batch_sizes if phase == "zoom"] == [3, 2, 1]
    assert model.calls["speculate"] == 0
    answers = {job_id: outcome.answer for job_id, outcome in outcomes.items()}  # type: ignore[union-attr]
    assert answers == {"at-once": "A", "one-zoom": "B", "two-zooms": "B"}
    steps = outcomes["two-zooms"].zoom_steps  # type: ignore[union-attr]
    assert len(steps) == 3 and steps[-1]["observation"] == "answered"
    assert steps[0]["box_original"] is not None and steps[1]["tool_call"] is not None


def test_a_zoom_is_cropped_from_the_original_as_the_agents_are():
    model = ScriptedModel(SCRIPTS)
    (found,) = speculate_in_depth(
        queries("one-zoom", size=(640, 480)), model, depth=1, max_new_tokens=256, top_k=8
    )
    # the scripted model's grid is the default rule's: the 640x480 image is seen whole
    step = found.steps[0]
    assert step.box_model == [10.0, 10.0, 40.0, 40.0]
    width, height = model.resize_rule.size_for(640, 480)
    scale_x, scale_y = 640 / width, 480 / height
    assert step.box_original == [
        int(10 * scale_x),
        int(10 * scale_y),
        int(40 * scale_x),
        int(40 * scale_y),
    ]
    assert found.speculation is not None and found.speculation.answer == "B"


def test_the_turn_after_the_last_zoom_must_answer_and_says_why_it_did_not():
    scripts = {
        "zooms-again": JobScript(zoom_steps=(zoom([10, 10, 40, 40]),)),
        "rambles": JobScript(zoom_steps=(zoom([10, 10, 40, 40]), "<think>hm</think>")),
    }
    outcomes = fast(ScriptedModel(scripts), tuple(scripts), speculation_depth=1)
    assert outcomes["zooms-again"].reason == DeferReason.DEPTH_EXHAUSTED  # type: ignore[union-attr]
    rambles = outcomes["rambles"]
    assert isinstance(rambles, Deferred) and rambles.reason == DeferReason.ZOOM_INVALID
    assert rambles.detail.startswith("zoom 2: ")


def test_the_agents_box_rules_are_the_small_models_too():
    from common.config import AgentSettings

    model = ScriptedModel(SCRIPTS)
    result = run_fast_stage(
        queries("one-zoom"),
        large=model,
        small=model,
        settings=FunnelSettings(speculation_depth=1),
        limits=AgentSettings(min_box_side=40),  # the 30 px box is refused
    )
    (outcome,) = result.outcomes
    assert isinstance(outcome, Deferred) and outcome.reason == DeferReason.ZOOM_INVALID
    assert "must be larger than 40" in outcome.detail


def test_depth_is_refused_with_thyme_whose_tool_is_code():
    from pydantic import ValidationError

    from common.config import Settings

    with pytest.raises(ValidationError, match="Thyme's protocol has none"):
        Settings(speculation_depth=1, agent="thyme")


def test_no_answer_after_d_zooms_defers_the_job_with_its_reason():
    model = ScriptedModel(SCRIPTS)
    outcomes = fast(model, ("never-answers", "one-zoom"), speculation_depth=1)
    late = outcomes["never-answers"]
    assert isinstance(late, Deferred) and late.reason == DeferReason.DEPTH_EXHAUSTED
    assert late.detail == "no answer after 1 zoom(s)" and len(late.zoom_steps) == 2
    assert isinstance(outcomes["one-zoom"], Accepted)


def test_the_gate_still_decides_after_a_zoom():
    model = ScriptedModel(SCRIPTS)
    outcomes = fast(model, ("unsure",), speculation_depth=1)
    unsure = outcomes["unsure"]
    assert isinstance(unsure, Deferred) and unsure.reason == DeferReason.LOW_CONFIDENCE
    assert unsure.small_answer == "B" and len(unsure.zoom_steps) == 2


def test_which_jobs_may_zoom_is_a_setting():
    model = ScriptedModel(SCRIPTS)
    only_tool_free = fast(model, ("tools",), speculation_depth=1, depth_scope="tool_free")
    assert only_tool_free["tools"].reason == DeferReason.TOOLS_NEEDED  # type: ignore[union-attr]
    assert FunnelSettings().depth_scope == "all"  # (the default, by measurement)
    sent_early: list[str] = []
    everyone = run_fast_stage(
        queries("tools"),
        large=model,
        small=model,
        settings=FunnelSettings(speculation_depth=1, depth_scope="all"),
        on_screened=lambda deferred: sent_early.extend(d.job_id for d in deferred),
    ).outcomes
    assert not sent_early  # (it is not on its way to the agent: it zooms first)
    everyone = {outcome.job_id: outcome for outcome in everyone}
    assert isinstance(everyone["tools"], Accepted) and everyone["tools"].screen.needs_tools  # type: ignore[union-attr]


HOSTILE = {
    "huge-box": zoom([-1e9, -1e9, 1e9, 1e9]),  # clamped to the image: a crop of it all
    "overflowing-box": zoom([0, 0, 1.7e308, 10]),  # finite, infinite once scaled
    "negative-box": zoom([-50, -50, -10, -10]),
    "huge-integer": zoom("X").replace('"X"', "[1, 2, 3, " + "9" * 400 + "]"),
    "endless-integer": zoom("X").replace('"X"', "[1, 2, 3, " + "9" * 5000 + "]"),
    "deep-brackets": "<tool_call>" + "[" * 5000 + "</tool_call>",
    "empty-answer": "<think>hm</think><answer> </answer>",
    "tagged-answer": "<think>I write <answer> tags</think><answer>B</answer>",
    "no-numbers": zoom("everything"),
    "not-json": "<tool_call>{bbox_2d: [1, 2</tool_call>",
    "thousand-calls": zoom([10, 10, 40, 40]) * 1000,
    "open-answer": "<think>hm</think><answer>B and on and on",
    "other-tool": '<tool_call>{"name": "rm", "arguments": {"bbox_2d": [1, 1, 9, 9]}}</tool_call>',
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_turns_cost_at_most_d_crops_and_defer_only_their_job(name):
    scripts = {name: JobScript(zoom_steps=(HOSTILE[name], ANSWER)), "one-zoom": SCRIPTS["one-zoom"]}
    model = ScriptedModel(scripts, resize_rule=ResizeRule(max_pixels=64 * 64))
    # an image larger than the model's view: boxes are scaled up to the original
    result = run_fast_stage(
        queries(name, "one-zoom", size=(8000, 4000)),
        large=model,
        small=model,
        settings=FunnelSettings(speculation_depth=2, zoom_max_new_tokens=100_000),
    )
    outcomes = {outcome.job_id: outcome for outcome in result.outcomes}
    assert isinstance(outcomes["one-zoom"], Accepted)
    hostile = outcomes[name]
    crops = [step for step in hostile.zoom_steps if step["box_original"] is not None]  # type: ignore[union-attr]
    assert len(crops) <= 2
    if name in ("huge-box", "overflowing-box", "thousand-calls"):  # one crop, the answer
        assert isinstance(hostile, Accepted) and len(crops) == 1
        if name != "thousand-calls":  # clamped to the image, however far out
            assert crops[0]["box_original"][:3] == [0, 0, 8000]
    else:
        assert isinstance(hostile, Deferred) and hostile.reason == DeferReason.ZOOM_INVALID
        assert hostile.detail.startswith(("zoom 1: ", "turn 1: ")) and not crops


def test_a_small_model_error_while_zooming_defers_that_job_alone():
    scripts = {"breaks": JobScript(fail=frozenset({"zoom"})), "one-zoom": SCRIPTS["one-zoom"]}
    outcomes = fast(ScriptedModel(scripts), ("breaks", "one-zoom"), speculation_depth=1)
    assert outcomes["breaks"].reason == DeferReason.SMALL_MODEL_ERROR  # type: ignore[union-attr]
    assert isinstance(outcomes["one-zoom"], Accepted)


def test_the_gate_reads_the_tokens_of_the_answer_alone():
    pieces = ("<think>", "look", "</think>", "<answer>", "B", "ig", "</answer>", "\n")
    rows = [[float(n), 0.0] for n in range(len(pieces))]
    generation = Generation(
        "".join(pieces), "stop", len(pieces), TokenScores(rows, [0.0] * len(rows)), pieces
    )
    assert answer_scores(generation).top_values == [[4.0, 0.0], [5.0, 0.0]]
    # a server that leaves the stop string out of its tokens: to the turn's end
    served = ("<think>", "long", " reasoning", "</think>", "<answer>", "B")
    cut = Generation("".join(served), "stop", 6, TokenScores(rows[:6], [0.0] * 6), served)
    assert answer_scores(cut).top_values == [rows[5]]
    bare = Generation("B C", "eos", 3, TokenScores(rows[:3], [0.0] * 3), ("B", " ", "C"))
    assert answer_scores(bare).top_values == rows[:3]  # (no <answer> at all: every row)


def test_a_round_shows_the_small_model_at_most_its_pixel_budget_in_one_call():
    """fast_batch_pixels bounds a round as it bounds a micro-batch's decoding: a call
    holds conversations whose images (each job's image and crops so far) fit it
    together, or one conversation alone."""
    model = ScriptedModel(SCRIPTS)
    shown: list[list[int]] = []
    real = model.agent_turns

    def spy(conversations, **kwargs):
        shown.append([sum(i.width * i.height for i in c.images) for c in conversations])
        return real(conversations, **kwargs)

    model.agent_turns = spy  # type: ignore[method-assign]
    jobs = ("one-zoom", "two-zooms", "at-once", "unsure")
    image = model.protocol.view(Image.new("RGB", (64, 64)))
    budget = int(2.5 * image.width * image.height)  # two first turns fit, not three
    outcomes = fast(model, jobs, speculation_depth=2, fast_batch_pixels=budget)
    assert all(len(call) == 1 or sum(call) <= budget for call in shown)
    assert [len(call) for call in shown][:2] == [2, 2]  # the first round, in two calls
    assert outcomes["two-zooms"].answer == "B"  # type: ignore[union-attr]


def test_a_calibration_run_at_depth_keeps_what_each_shallower_depth_replays():
    """Every job zooms in a calibration run, whatever the screen said, and keeps the
    zooms before its answer, that answer's scores at the replay width, and each round's
    share of time and tokens; its depth-0 answer stays the record's."""
    from common.scores import REPLAY_K

    model = ScriptedModel(SCRIPTS)
    jobs = ("at-once", "one-zoom", "two-zooms", "never-answers", "tools")
    outcomes = fast(model, jobs, calibrate=True, speculation_depth=2)
    records = {}
    for job_id, outcome in outcomes.items():
        assert isinstance(outcome, Deferred) and outcome.reason == DeferReason.CALIBRATION
        assert outcome.replay is not None and outcome.depth_replay is not None
        records[job_id] = outcome.depth_replay
    assert {job: record.zooms for job, record in records.items()} == {
        "at-once": 0,
        "one-zoom": 1,
        "two-zooms": 2,
        "never-answers": None,
        "tools": 1,  # (the screen sent it to the agent: it zooms all the same)
    }
    assert records["two-zooms"].answer == "B" and records["never-answers"].answer is None
    assert len(records["two-zooms"].scores.top_values[0]) == REPLAY_K
    assert [len(r.round_tokens) for r in records.values()] == [1, 2, 3, 3, 2]
    assert all(r.depth == 2 for r in records.values())
    # (replayed at depth 1, the job that zoomed twice is deferred; at depth 2 it answers)
    assert not records["two-zooms"].answers_at(1) and records["two-zooms"].answers_at(2)
    assert outcomes["one-zoom"].small_answer == "A"  # (its depth-0 answer)
