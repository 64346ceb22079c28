"""Speculation in depth, replayed (``common.evaluation.depth``): which jobs each depth and
scope accepts, and what they cost, from one calibration run's records."""

from __future__ import annotations

import math

import pytest
from PIL import Image

from common.backends.scripted import JobScript, ScriptedModel
from common.config import GateSettings
from common.contracts import Query
from common.evaluation.depth import agent_alone, recorded_depth, replay_depths
from common.scores import DepthReplay, TokenScores, encode
from common.store.analytics import CalibrationItem

GATE = GateSettings(mode="min", top_k=64, threshold=0.9)


def scores(confidence: float) -> TokenScores:
    """An answer the min gate scores at ``confidence``."""
    model = ScriptedModel({"j": JobScript(confidence=confidence)})
    query = Query("j", Image.new("RGB", (8, 8)), "Q?")
    (speculation,) = model.speculate([query], max_new_tokens=8, top_k=64)
    return speculation.scores


def item(
    *,
    tool_free: bool = True,
    direct: float,
    zooms: int | None,
    deep: float = 0.99,
    right: bool = True,
    depth_right: bool = True,
    agent_right: bool = True,
) -> CalibrationItem:
    """A job: its depth-0 answer's confidence, and the zooms (and confidence) of its
    answer in depth; each stage's seconds are round numbers: screen 1, depth-0 answer 2,
    each round of zooms 3 (10 tokens), the agent 100 (50 tokens)."""
    record = DepthReplay(
        depth=2,
        zooms=zooms,
        answer=None if zooms is None else "B",
        scores=None if zooms is None else scores(deep),
        round_seconds=[3.0] * (3 if zooms is None else zooms + 1),
        round_tokens=[10] * (3 if zooms is None else zooms + 1),
        screen_seconds=1.0,
        speculate_seconds=2.0,
    )
    return CalibrationItem(
        confidence=direct,
        right=right,
        gate=GATE.model_dump(),
        replay=encode(scores(direct)),
        tool_free=tool_free,
        agent_right=agent_right,
        depth=record,
        depth_right=None if zooms is None else depth_right,
        agent_seconds=100.0,
        agent_tokens=50,
    )


ITEMS = [
    item(direct=0.99, zooms=0),  # sure at once, at every depth
    item(direct=0.6, zooms=1, depth_right=False, agent_right=True),  # sure after a zoom
    item(tool_free=False, direct=0.99, zooms=2),  # the screen's "tools": only scope all
    item(direct=0.99, zooms=None, right=False, agent_right=False),  # never answers in depth
]


def test_each_depth_accepts_the_answers_it_would_have_reached():
    rows = {row.label: row for row in replay_depths(ITEMS, GATE, 2)}
    assert list(rows) == ["D=0", "D=1", "D=1 (all)", "D=2", "D=2 (all)"]
    accepted = {label: round(row.accepted * 4) for label, row in rows.items()}
    # D=0: the 1st and 4th (sure, tool-free); D=1: the 1st and 2nd (the 4th never answers
    # in depth); all at D=2 adds the 3rd, which zoomed twice
    assert accepted == {"D=0": 2, "D=1": 2, "D=1 (all)": 2, "D=2": 2, "D=2 (all)": 3}
    assert rows["D=0"].beta == 0.75 and rows["D=1 (all)"].beta == 1.0
    assert rows["D=2 (all)"].alpha == 0.75
    # D=0 takes the 4th's wrong small answer; D=1 the 2nd's wrong zoomed one, and leaves
    # the 4th to the agent, wrong too
    assert rows["D=0"].accuracy == 0.75 and rows["D=1"].accuracy == 0.5
    assert rows["D=2 (all)"].accuracy == 0.5  # (the 4th: the agent is wrong too)


def test_each_job_costs_its_own_stages_and_the_agent_where_it_ran():
    rows = {row.label: row for row in replay_depths(ITEMS, GATE, 2)}
    # D=0: 1+2 | 1+2+100 | 1+100 | 1+2+3 ... per job; the agent alone: 400 s
    d0 = (1 + 2) + (1 + 2 + 100) + (1 + 100) + (1 + 2)
    assert math.isclose(rows["D=0"].speedup, 400 / d0)
    # D=2 (all): 1+3 | 1+6 | 1+9 | 1+9+100
    d2 = (1 + 3) + (1 + 6) + (1 + 9) + (1 + 9 + 100)
    assert math.isclose(rows["D=2 (all)"].speedup, 400 / d2)
    # tokens: the small model's rounds, and the agent's 50 where it ran
    assert rows["D=2 (all)"].tokens == (10 + 20 + 30 + 30 + 50) / 4
    assert agent_alone(ITEMS).tokens == 50 and agent_alone(ITEMS).accuracy == 0.75


def test_the_gate_decides_at_every_depth():
    strict = GATE.model_copy(update={"threshold": 0.995})
    rows = replay_depths(ITEMS, strict, 2)
    assert all(row.accepted == 0 for row in rows)


def test_a_depth_deeper_than_the_run_is_refused():
    assert recorded_depth(ITEMS) == 2
    with pytest.raises(ValueError, match="depth >= 3"):
        replay_depths(ITEMS, GATE, 3)
    plain = [CalibrationItem(0.9, True, {}, encode(scores(0.9)))]
    assert recorded_depth(plain) == 0
    with pytest.raises(ValueError, match="depth >= 1"):
        replay_depths(plain, GATE, 0)
