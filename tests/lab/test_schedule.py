"""The overhead-free replay of a run's draws (``lab.bench.schedule``)."""

from __future__ import annotations

import random

import pytest

from common.contracts import DeferReason
from lab.bench.pipeline import chunk_spans
from lab.bench.schedule import Draw, Schedule, _draw, overhead_free

S, A, G, D = Draw.SCREENED, Draw.ACCEPTED, Draw.GATED, Draw.DIRECT


def test_the_first_batch_runs_in_halves_and_each_group_releases_its_rejects_in_turn():
    # calls cost 0.5 s (half of 1.0 s per batch); the first batch of 4 is two groups of 2
    schedule = Schedule(batch_size=4, fast_batch_s=1.0, fast_job_s=0.0, agent_s=1.0, agents=1)
    replay = overhead_free([S, A, G, A], schedule)
    # group 1: screen to 0.5 (S released), speculate to 1.0; group 2: screen to 1.5,
    # speculate to 2.0 (G released). The agent: S 0.5-1.5, G 2.0-3.0.
    assert replay.seconds == pytest.approx(3.0)
    assert replay.bound_s == pytest.approx(2.0)  # fast 2.0 s, agents 2 x 1.0 s / 1
    assert replay.efficiency == pytest.approx(2 / 3)


def test_a_group_with_nothing_to_speculate_makes_no_speculation_call():
    schedule = Schedule(batch_size=2, fast_batch_s=1.0, fast_job_s=0.0, agent_s=1.0, agents=2)
    replay = overhead_free([S, S], schedule)  # two groups of one, each screened only
    assert replay.seconds == pytest.approx(2.0)  # the second reject at 1.0, done at 2.0


def test_a_baseline_goes_straight_to_the_agents_and_whole_trajectories_leave_a_tail():
    schedule = Schedule(batch_size=32, fast_batch_s=1.0, fast_job_s=0.03, agent_s=1.0, agents=4)
    replay = overhead_free([D] * 10, schedule)
    assert replay.seconds == pytest.approx(3.0)  # ceil(10 / 4) trajectories
    assert replay.bound_s == pytest.approx(2.5)


def test_no_replay_beats_the_overlap_bound():
    schedule = Schedule(batch_size=32, fast_batch_s=1.0, fast_job_s=0.03, agent_s=1.0, agents=4)
    rng = random.Random(7)
    for _ in range(50):
        draws = [rng.choice([S, A, A, G]) for _ in range(rng.randint(1, 120))]
        replay = overhead_free(draws, schedule)
        assert replay.seconds >= replay.bound_s - 1e-9
        assert 0 < replay.efficiency <= 1


def test_draws_follow_the_recorded_outcome():
    assert _draw("small", None) == A
    assert _draw("large", DeferReason.LOW_CONFIDENCE) == G
    assert _draw("large", DeferReason.TOOLS_NEEDED) == S
    assert _draw("large", DeferReason.BASELINE) == D


def test_the_pipeline_bench_submits_one_fast_batch_first_then_chunks():
    assert chunk_spans(200, 32, 500) == [range(0, 32), range(32, 200)]
    assert chunk_spans(1100, 32, 500) == [
        range(0, 32),
        range(32, 532),
        range(532, 1032),
        range(1032, 1100),
    ]
    assert chunk_spans(20, 32, 500) == [range(0, 20)]
    assert chunk_spans(0, 32, 500) == []


def test_the_command_summarises_random_draws(capsys):
    from lab.bench.schedule import main

    assert main(["--jobs", "40", "--agents", "2", "--runs", "20"]) == 0
    out = capsys.readouterr().out
    assert "40 jobs, 2 agent(s), 20 draws: efficiency mean 0." in out
    assert "of draws reach 0.95" in out
