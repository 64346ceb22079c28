"""A batch's usage and what the funnel saved (``common.store.usage``), from made-up
records: the arithmetic, its interval, and what it makes of records it cannot read."""

from __future__ import annotations

import math

import pytest

from common.contracts import Phase, Query, Usage
from common.pipeline.metering import Meter
from common.store.usage import RUN_TO_RUN, BatchUsage, t_95
from tests.helpers.store import finished_job


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
    # (Student's t, 2 degrees of freedom); beside it, another run's pace (5% of 12 s)
    half = math.hypot(4.302653 * math.sqrt(3 * 4.0 + 9 * 4.0 / 3), 1.959964 * 0.05 * 12.0)
    # (its low end no lower than nothing avoided at all: the fast stage's 3 s spent)
    assert (saved.low, saved.high) == (-3.0, pytest.approx(9.0 + half))
    assert saved.per_job_s == pytest.approx(4.0)
    shown = usage.to_dict(price_per_gpu_hour=3.6)
    assert shown["seconds"] == {"agent": 9.0, "sandbox": 3.0, "screen": 1.5, "speculate": 1.5}
    assert shown["tokens_in"] == 60 and shown["tokens_out"] == 12 and shown["jobs"] == 6
    assert shown["cost"] == pytest.approx(15.0 * 0.001) and shown["saved_cost"] == 0.009


def test_audits_of_the_accepted_jobs_are_the_basis_and_their_cost_is_taken_off():
    """An audit runs the agent on accepted jobs themselves: where two or more were, their
    time is known and the rest are priced at their mean; the audits cost time too."""
    usage = BatchUsage()
    for seconds in (1.0, 3.0):  # accepted and audited
        usage.add(fast(0.5), None, "small", needs_tools=False, audit=agent(seconds))
    for _ in range(4):  # accepted, not audited
        usage.add(fast(0.5), None, "small", needs_tools=False)
    for _ in range(3):  # deferred, screened tool-free: not needed as a basis here
        usage.add(fast(0.5), agent(50.0), "large", needs_tools=False)
    saved = usage.saved()
    assert saved is not None and saved.basis == "audits" and saved.measured == 2
    assert saved.avoided_s == pytest.approx(1.0 + 3.0 + 4 * 2.0)
    assert saved.seconds == pytest.approx(12.0 - 4.5 - 4.0)  # less fast (9 x 0.5), audits
    sampled = 12.706205 * math.sqrt(4 * 2.0 + 16 * 2.0 / 2)  # 4 unknown, variance 2, 1 df
    half = math.hypot(sampled, 1.959964 * 0.05 * 12.0)  # (and a run's pace: 5% of 12 s)
    assert saved.high == pytest.approx(saved.seconds + half)
    assert usage.to_dict()["seconds"]["audit"] == 4.0


def test_without_tool_free_runs_an_accepted_job_costs_one_turn_priced_by_its_tokens():
    """Jobs the screen sent to the agent zoom first: their whole time is no measure of an
    easy job's. A turn's cost is fitted on its tokens (here exactly 0.01 + 0.001 a token
    read + 0.002 a token written), and an accepted job costs one: a first turn's prompt,
    an answering turn's length."""
    usage = BatchUsage()
    for _ in range(4):
        usage.add(fast(0.1), None, "small")

    def turn(read: int, wrote: int) -> list:
        return [read, wrote, 0.01 + 0.001 * read + 0.002 * wrote]

    for read, zoom, answer in ((100, 60, 10), (120, 50, 14), (110, 70, 12)):
        run = {"seconds": {"agent": 1.0}, "turns": [turn(read, zoom), turn(read + 200, answer)]}
        usage.add(fast(0.1), run, "large", needs_tools=True)
    saved = usage.saved()
    assert saved is not None and saved.basis == "turn_model" and saved.measured == 3
    one_turn = 0.01 + 0.001 * 110 + 0.002 * 12  # at the mean first prompt, answer length
    assert saved.avoided_s == pytest.approx(4 * one_turn)
    assert saved.seconds == pytest.approx(4 * one_turn - 0.7)
    # an exact fit: only another run's pace is left (5% of the time avoided)
    assert saved.high - saved.low == pytest.approx(2 * 1.959964 * 0.05 * 4 * one_turn)
    hostile = BatchUsage()  # turns all alike: no fit, no claim
    for _ in range(3):
        hostile.add(None, {"turns": [[5, 5, 0.1], [5, 5, 0.1]]}, "large")
    assert hostile.saved() is None


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
    endless = {
        "seconds": {"agent": 1e308, "gate": float("nan")},
        "tokens_in": 1e999,
        "turns": [[1e999, 1, 0.5], [2, 3, 0.25]],
    }
    assert Usage.of(endless) == Usage({}, 0, 0, [(2, 3, 0.25)])
    kept = Usage({"screen": 0.1}, 3, 4, turns=[(3, 2, 0.5), (9, 1, 0.25)])
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
    distribution, some accepted (their draws hidden, as the funnel never runs them), and
    measured again by an agent-alone run at its own pace (the whole run 5% faster or
    slower, a normal draw: ``RUN_TO_RUN``). The 95% interval holds that run's figure,
    less the fast stage, in 91% of batches of 40 (skew costs a few points at this size:
    the interval assumes a symmetric spread)."""
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
        alone = hidden * draws.gauss(1.0, RUN_TO_RUN)  # (the other run's pace)
        held += saved.low <= alone - usage.fast_s <= saved.high
    assert 0.90 <= held / batches <= 0.98, held / batches


def test_a_tenants_seconds_are_summed_in_sql_as_usage_reads_them(sessions):
    """``seconds_since`` (what a compute quota adds up, in SQL on either store) agrees
    with ``by_day`` (the same records read in Python), hostile records included."""
    from datetime import UTC, datetime, timedelta

    from common.store import usage as store_usage

    now = datetime.now(UTC)
    records = [
        ({"seconds": {"screen": 0.5, "gate": 0.25}}, {"seconds": {"agent": 2.0, "sandbox": 1}}),
        ({"seconds": {"screen": "9", "speculate": True, "gate": -1}}, None),
        (None, {"seconds": {"agent": 1e300, "sandbox": 0.125}, "turns": "many"}),
        ({"seconds": ["not", "a", "map"]}, {"seconds": {"nope": 5, "agent": 0.75}}),
    ]
    with sessions.begin() as session:
        for index, (fast, agent) in enumerate(records):
            audit = agent if index == 0 else None
            finished_job(session, "t", now, fast_usage=fast, agent_usage=agent, audit_usage=audit)
        finished_job(
            session, "t", now - timedelta(days=2), agent_usage={"seconds": {"agent": 100.0}}
        )
    start = now - timedelta(hours=1)
    with sessions() as session:
        summed = store_usage.seconds_since(session, "t", start)
        (day,) = store_usage.by_day(session, "t", start, now + timedelta(hours=1))
    expected = 0.75 + 3.0 + 0.125 + 0.75 + 3.0  # (the first job's audit: 3 s more)
    assert summed == pytest.approx(day.spent.total_s) == pytest.approx(expected)
