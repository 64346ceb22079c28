"""The shipped synth models: they load through the normal backend and do their job.

A handful of items, so this stays fast. The models are deterministic (greedy decoding,
fixed weights); the thresholds leave room for a borderline item on another CPU.
"""

from __future__ import annotations

import pytest

from common.agents.deepeyes import run_deepeyes
from common.backends import load_models
from common.config import AgentSettings, FunnelSettings, GateSettings, Settings
from common.contracts import Accepted, Deferred, Query
from common.pipeline.funnel import run_fast_stage
from common.protocols.scoring import is_correct
from lab.synth.world import make_item

# The gate threshold these models are served with (make demo): the small model's answers
# are over a handful of words, so a sure answer's separability sits lower than a 2B
# model's over its whole vocabulary (README, "Measured").
SYNTH_TAU = 0.9


@pytest.fixture(scope="module")
def synth_models():
    return load_models(Settings(small_model="synth", large_model="synth", device="cpu"))


def query(item) -> Query:
    return Query(
        item.id, item.render(), item.question, tuple(item.options) if item.options else None
    )


def test_on_hard_items_the_agent_zooms_into_the_targets_cell_then_answers(synth_models):
    hard = [make_item(seed, difficulty="hard") for seed in range(100, 110)]
    on_target = answered = right = 0
    for item in hard:
        trajectory = run_deepeyes(query(item), synth_models.large, AgentSettings(max_steps=3))
        box = trajectory.steps[0].box_original
        on_target += box == list(item.cell)  # the crop, in original pixels, is the cell
        answered += trajectory.answer is not None and len(trajectory.steps) == 2
        right += is_correct(trajectory.answer, item.answer, item.options)
    # measured: 10 of 10 crops on the cell (a box by chance: 1 in 16), answered and right
    assert on_target >= 8 and answered >= 9 and right >= 8


def test_the_funnel_sends_easy_items_to_the_small_model_and_hard_ones_on(synth_models):
    items = [make_item(seed, difficulty="easy") for seed in range(200, 220)]
    items += [make_item(seed, difficulty="hard") for seed in range(300, 304)]
    outcomes = run_fast_stage(
        [query(item) for item in items],
        large=synth_models.large,
        small=synth_models.small,
        settings=FunnelSettings(gate=GateSettings(threshold=SYNTH_TAU)),
    ).outcomes
    easy, hard = outcomes[:20], outcomes[20:]
    # every easy item reaches the small model; the gate keeps the sure ones
    assert all(isinstance(o, Accepted) or o.reason == "low_confidence" for o in easy)
    accepted = [o for o in easy if isinstance(o, Accepted)]
    right = {item.id: item.answer for item in items}
    # measured: 20 of 20 accepted, all right (the bench: every easy item)
    assert len(accepted) >= 16
    assert sum(o.answer == right[o.job_id] for o in accepted) >= len(accepted) - 1
    assert all(isinstance(o, Deferred) and o.reason == "tools_needed" for o in hard)


def test_the_shipped_small_model_zooms_into_the_targets_cell_on_hard_items(synth_models):
    """Speculation in depth with the shipped small model, through the serving path
    (``lab.synth.zoom_report``): on held-out hard items its first turn is a zoom into the
    target's cell, and the answer after it is right; on easy ones it answers at once."""
    from lab.synth.zoom_report import zoom_report

    settings = Settings(small_model="synth", large_model="synth", device="cpu")
    report = zoom_report(synth_models, settings, count=8, seed=78)
    hard, easy = report["hard"]["depth_1"], report["easy"]["depth_1"]
    assert report["hard"]["items"] and report["easy"]["items"]
    assert hard["well_formed_zoom"] == hard["on_target"] == 1.0
    assert hard["after_zoom"]["right"] == 1.0
    assert easy["well_formed_zoom"] == 0.0 and easy["answered_without_zoom"] == 1.0
