"""``bench pipeline`` end to end, small: its figures and where the overhead went."""

from __future__ import annotations

from common.config import Settings
from lab.bench.pipeline import PipelinePlan, bench_pipeline
from tests.helpers.services import REDIS_URL


def test_the_pipeline_bench_accounts_for_its_overhead(postgres_url: str, redis_client):
    """Every job is counted, and the submitter's and the workers' own time is read back:
    rows written, messages sent, claims and records from the workers' /metrics, and the
    follower's reads (a mixed run, so trajectories are claimed and recorded too)."""
    settings = Settings(database_url=postgres_url, broker={"url": REDIS_URL})
    env = {"SPECEYES_SCRIPTED__TOOL_FREE": "0.5", "SPECEYES_SCRIPTED__CONFIDENT": "0.5"}
    figures = bench_pipeline(settings, PipelinePlan(120, worker_env=env), log=lambda line: None)
    assert figures.jobs == 120 and figures.seconds > 0
    spent = dict(figures.overhead.rows())
    for what in ("submission: rows", "submission: messages", "claims", "records", "result reads"):
        assert spent[what] > 0, what
    assert spent["sends on to the slow queue"] > 0  # deferred jobs were passed on
    assert figures.overhead.worker_cpu_s > 0
    assert 0 < figures.p50_s <= figures.p99_s
