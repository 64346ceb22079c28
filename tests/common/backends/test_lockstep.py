"""Lockstep batching: N trajectories batched are the same N run one by one (tiny
checkpoints, greedy), including ones that stop at different steps and ones that fail."""

from __future__ import annotations

import threading

import pytest
from PIL import Image, ImageDraw

from common.backends import load_models
from common.backends.lockstep import Lockstep
from common.config import AgentSettings, Settings
from common.contracts import Query
from common.pipeline.funnel import run_agent_stage
from tests.helpers.models import ForceText


def queries(count: int) -> list[Query]:
    made = []
    for index in range(count):
        image = Image.new("RGB", (96 + 28 * (index % 3), 80 + 14 * index), (index * 30, 90, 20))
        ImageDraw.Draw(image).rectangle((5, 5, 40 + index, 30), fill=(255, 255, 255))
        options = ("yes", "no") if index % 2 else None
        made.append(Query(f"q{index}", image, f"Is shape {index} white?", options))
    return made


def run_together(model, items, limits):
    wrapped = Lockstep(model, max_batch=len(items), max_wait_s=2.0)
    outcomes: dict[str, object] = {}

    def one(query: Query) -> None:
        outcomes[query.job_id] = run_agent_stage(query, wrapped, limits)

    threads = [threading.Thread(target=one, args=(q,)) for q in items]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return outcomes, wrapped.batch_sizes


def summary(outcome) -> tuple:
    steps = [
        (s.text, s.finish_reason, s.new_tokens, s.box_original) for s in outcome.trajectory.steps
    ]
    return outcome.answer, outcome.error_code, steps


@pytest.mark.parametrize("max_new_tokens", [6, 24])
def test_batched_trajectories_are_the_ones_run_one_by_one(tiny_large, max_new_tokens):
    items = queries(5)
    limits = AgentSettings(max_steps=3, max_new_tokens=max_new_tokens)
    alone = {q.job_id: run_agent_stage(q, tiny_large, limits) for q in items}
    together, sizes = run_together(tiny_large, items, limits)
    for query in items:
        assert summary(together[query.job_id]) == summary(alone[query.job_id]), query.job_id
    assert max(sizes) > 1  # they did share generate calls
    # what each used: the tokens it read as alone, and its share of each batched call,
    # never the whole call (nor the wait for it) for every job in it
    for query in items:
        batched, single = together[query.job_id].trajectory, alone[query.job_id].trajectory
        assert batched.usage().tokens_in == single.usage().tokens_in > 0
        for step in batched.steps:
            assert step.model_seconds is not None
            assert 0 < step.model_seconds <= step.generate_seconds


def test_trajectories_that_end_at_different_steps_and_fail_keep_their_own_course(tiny_large):
    zoom = '<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1, 1, 30, 30]}}</tool_call>'  # noqa: E501
    bad = '<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1, 2]}}</tool_call>'
    scripts = {
        "q0": ["<answer>A</answer>"],  # ends at step 1
        "q1": [zoom, "<answer>B</answer>"],  # ends at step 2
        "q2": [zoom, zoom, zoom],  # runs out of steps: step_limit
        "q3": [bad],  # a call it cannot carry out: tool_call_invalid
    }
    items = queries(4)
    limits = AgentSettings(max_steps=3, max_new_tokens=48)

    class PerJob:
        """Force each row's text by its job (its prompt names the shape's index)."""

        def __init__(self) -> None:
            self.force = {
                key: ForceText(tiny_large.tokenizer, texts, tiny_large.eos_ids[0])
                for key, texts in scripts.items()
            }

        def __call__(self, input_ids, scores):
            for row in range(input_ids.shape[0]):
                text = tiny_large.tokenizer.decode(input_ids[row])
                key = next(k for k in scripts if f"shape {k[1:]} white" in text)
                scores[row : row + 1] = self.force[key](
                    input_ids[row : row + 1], scores[row : row + 1]
                )
            return scores

    tiny_large.logits_processors = [PerJob()]
    try:
        alone = {q.job_id: run_agent_stage(q, tiny_large, limits) for q in items}
        tiny_large.logits_processors = [PerJob()]
        together, _ = run_together(tiny_large, items, limits)
    finally:
        tiny_large.logits_processors = []
    assert [alone[k].error_code for k in scripts] == [None, None, "step_limit", "tool_call_invalid"]
    for key in scripts:
        assert summary(together[key]) == summary(alone[key]), key


def test_agent_workers_share_one_model_batched_as_the_settings_say(tiny_cache_dir):
    settings = Settings(
        backend="transformers",
        small_model="tiny",
        large_model="tiny",
        cache_dir=tiny_cache_dir,
        agent_workers=3,
        **{"agent.step_wait_s": 0.7},
    )
    large = load_models(settings).large
    assert isinstance(large, Lockstep)
    assert (large.max_batch, large.max_wait_s) == (3, 0.7)
