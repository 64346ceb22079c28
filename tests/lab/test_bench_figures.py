"""The benches' derived figures: the overlap bound, efficiency, and the gap's parts."""

from __future__ import annotations

import pytest

from lab.bench.embedded import EmbeddedFigures


def test_the_bound_is_the_busier_stage_and_whole_trajectories_leave_a_tail():
    # 113 trajectories of 1 s on 4 agents: one agent runs 29, so 0.75 s beyond 113 / 4
    run = EmbeddedFigures(
        jobs=200,
        seconds=30.0,
        beta=0.7,
        alpha=0.7,
        small_share=0.4,
        fast_busy_s=12.0,
        agent_busy_s=113.0,
        agent_workers=4,
        agent_jobs=113,
        fill_s=0.8,
    )
    assert run.agents_bound
    assert run.bound_jobs_per_s == pytest.approx(200 / 28.25)
    assert run.efficiency == pytest.approx(28.25 / 30.0)
    assert run.tail_s == pytest.approx(0.75)
    assert run.serial_jobs_per_s == pytest.approx(200 / 125.0)


def test_an_even_share_has_no_tail_and_a_fast_bound_run_is_not_agents_bound():
    even = EmbeddedFigures(200, 30.0, None, None, 0.0, 5.0, 100.0, 4, agent_jobs=100)
    assert even.tail_s == 0.0
    fast_bound = EmbeddedFigures(200, 30.0, None, None, 1.0, 29.0, 10.0, 4, agent_jobs=10)
    assert not fast_bound.agents_bound
    assert fast_bound.bound_jobs_per_s == pytest.approx(200 / 29.0)
