"""A batch's usage and what the funnel saved (``common.store.usage``), from made-up
records: the arithmetic, its interval, and what it makes of records it cannot read."""

from __future__ import annotations

import math

import pytest

from common.contracts import Phase, Query, Usage
from common.pipeline.metering import Meter
from common.store.usage import BatchUsage, t_95


def fast(seconds: float) -> dict:
    return {"seconds": {"screen": seconds / 2, "speculate": seconds / 2}, "tokens_in": 10}


def agent(seconds: float) -> dict:
    return {"seconds": {"agent": seconds * 0.75, "sandbox": seconds * 0.25}, "tokens_out": 4}


def test_saved_is_the_accepted_jobs_at_the_agents_mean_less_the_fast_stage():
    usage = BatchUsage()
    for _ in range(3):  # accepted: the fast stage only
        usage.add(fast(0.5), None, "small")
    for seconds in (2.0, 4.0, 6.0):  # deferred by the gate (screened tool-free): the agent
        usage.add(fast(0.5), agent(seconds), "large", needs_tools=False)
    usage.add(None, None, "large")  # recorded before usage was kept: not counted
    saved = usage.saved()
    assert saved is not None and saved.basis == "tool_free_runs"
    assert usage.fast_s == pytest.approx(3.0) and usage.agent_mean_s == pytest.approx(4.0)
    assert saved.avoided_s == pytest.approx(12.0)  # 3 accepted x 4 s
    assert saved.seconds == pytest.approx(9.0)  # less 6 x 0.5 s of screening and speculating
    assert saved.agent_alone_s == pytest.approx(24.0)  # 12 s run + 12 s avoided
    assert saved.share == pytest.approx(9.0 / 24.0)
    # the prediction interval of 3 more draws' sum: variance 4, 3 draws, 3 measured
    # (Student's t, 2 degrees of freedom)
    half = 4.302653 * math.sqrt(3 * 4.0 + 9 * 4.0 / 3)
    assert (saved.low, saved.high) == (pytest.approx(9.0 - half), pytest.approx(9.0 + half))
    shown = usage.to_dict(price_per_gpu_hour=3.6)
    assert shown["seconds"] == {"agent": 9.0, "sandbox": 3.0, "screen": 1.5, "speculate": 1.5}
    assert shown["tokens_in"] == 60 and shown["tokens_out"] == 12 and shown["jobs"] == 6
    assert shown["cost"] == pytest.approx(15.0 * 0.001) and shown["saved_cost"] == 0.009


def test_without_tool_free_runs_an_accepted_job_costs_the_agents_answering_turn():
    """Jobs the screen sent to the agent zoom first: their whole time is no measure of an
    easy job's. One answering turn is (each run's last step)."""
    usage = BatchUsage()
    for _ in range(4):
        usage.add(fast(0.1), None, "small")
    for turn in (0.2, 0.4):
        run = {"seconds": {"agent": 3.0, "sandbox": 1.0}, "steps": 3, "answer_s": turn}
        usage.add(fast(0.1), run, "large", needs_tools=True)
    saved = usage.saved()
    assert saved is not None and saved.basis == "answer_step" and saved.measured == 2
    assert saved.avoided_s == pytest.approx(4 * 0.3)  # not 4 x 4 s
    assert saved.seconds == pytest.approx(1.2 - 0.6)


def test_nothing_is_claimed_saved_until_two_jobs_ran_the_agent():
    usage = BatchUsage()
    usage.add(fast(1.0), None, "small")
    usage.add(fast(1.0), agent(5.0), "large", needs_tools=False)
    assert usage.saved() is None and usage.to_dict()["saved"] is None
    assert "cost" not in usage.to_dict()  # (no price set: seconds only)
    usage.add(None, None, "small")  # recorded before usage was kept: not counted
    assert usage.jobs == 2 and usage.accepted == 1


def test_students_t_is_the_tables():
    table = {1: 12.706, 2: 4.303, 3: 3.182, 5: 2.571, 10: 2.228, 30: 2.042, 1000: 1.962}
    for freedom, quantile in table.items():
        assert t_95(freedom) == pytest.approx(quantile, rel=0.01), freedom


def test_a_record_it_cannot_read_counts_as_nothing():
    hostile = {
        "seconds": {"screen": "1e9", "agent": -5, "gate": True, "nope": 3, "speculate": 0.25},
        "tokens_in": "many",
        "tokens_out": 7.0,
    }
    assert Usage.of(hostile) == Usage({"speculate": 0.25}, 0, 7)
    assert Usage.of(["not", "a", "record"]) == Usage() and Usage.of(None) == Usage()
    kept = Usage({"screen": 0.1}, 3, 4, steps=2, answer_s=0.5)
    assert Usage.of(kept.to_dict()) == kept


def test_a_batched_call_is_shared_by_the_jobs_it_ran(tmp_path):
    from PIL import Image

    image = Image.new("RGB", (4, 4))
    queries = [Query(f"j{i}", image, "Q?") for i in range(3)]
    meter = Meter()
    meter.share(Phase.SCREEN, 0.3, queries)
    meter.share(Phase.SPECULATE, 0.2, queries[:2])
    assert meter.jobs["j0"].seconds == pytest.approx({"screen": 0.1, "speculate": 0.1})
    assert meter.jobs["j2"].seconds == pytest.approx({"screen": 0.1})
    total = sum(usage.total_s for usage in meter.jobs.values())
    assert total == pytest.approx(0.5)  # the jobs add up to the calls' time


def test_the_interval_holds_the_agent_time_the_accepted_jobs_would_have_taken():
    """Simulated batches: jobs' agent times drawn from one skewed (log-normal)
    distribution, some accepted (their draws hidden, as the funnel never runs them). The
    95% interval holds the hidden draws' sum, less the fast stage, in 92% of batches of
    40 (skew costs a few points at this size: the interval assumes a symmetric spread)."""
    import random

    draws = random.Random(50)
    held, batches = 0, 2000
    for _ in range(batches):
        usage, hidden = BatchUsage(), 0.0
        for _ in range(40):
            seconds = draws.lognormvariate(0.0, 0.6)
            if draws.random() < 0.6:
                usage.add(fast(0.1), None, "small")
                hidden += seconds
            else:
                usage.add(fast(0.1), agent(seconds), "large", needs_tools=False)
        saved = usage.saved()
        assert saved is not None
        held += saved.low <= hidden - usage.fast_s <= saved.high
    assert 0.90 <= held / batches <= 0.98, held / batches
