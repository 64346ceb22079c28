"""``speceyes bench embedded``: the embedded runner over a scripted corpus, timed.

The scripted backend stands in for the models with simulated costs (seconds per fast
batch, per job, per agent step) and drawn shares (tool-free, confident), so a run shows
the runner's own overhead: how close it comes to the overlap bound, and to an
overhead-free run of the same draws (``lab.bench.schedule``).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

from common.backends import load_models
from common.backends.scripted import ScriptedSettings
from common.config import Settings
from common.pipeline.gate import warm_up
from common.pipeline.runner import EmbeddedRunner
from common.pipeline.submit import submit_corpus
from common.sources.corpus import read_source
from common.store import analytics
from common.store.db import open_store
from lab.bench.schedule import Draw, run_draws
from lab.bench.workload import write_corpus


@dataclass(frozen=True)
class EmbeddedFigures:
    """A timed run: jobs finished, the seconds they took, and the funnel's shares."""

    jobs: int
    seconds: float
    beta: float | None
    alpha: float | None
    small_share: float
    fast_busy_s: float = 0.0  # the fast stage's working time (its batches, summed)
    agent_busy_s: float = 0.0  # the agents' working time (trajectories, summed)
    agent_workers: int = 1
    agent_jobs: int = 0  # trajectories run
    fill_s: float = 0.0  # first fast batch's start to the first trajectory's
    draws: tuple[Draw, ...] = ()  # where each job went, in submission order (lab.bench.schedule)

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds if self.seconds else 0.0

    @property
    def bound_jobs_per_s(self) -> float:
        """The overlap bound: with the stages overlapping perfectly, the run takes as long
        as its busier stage (the agents' time shared by the workers)."""
        longest = max(self.fast_busy_s, self.agent_busy_s / self.agent_workers)
        return self.jobs / longest if longest else 0.0

    @property
    def efficiency(self) -> float:
        bound = self.bound_jobs_per_s
        return self.jobs_per_s / bound if bound else 0.0

    @property
    def agents_bound(self) -> bool:
        """Whether the agents, not the fast stage, set the bound."""
        return self.agent_busy_s / self.agent_workers >= self.fast_busy_s > 0

    @property
    def tail_s(self) -> float:
        """What whole trajectories cost beyond an even share: with ``n`` of them on ``w``
        agents, one agent runs ceil(n / w), so the run outlasts busy / w by the rest."""
        if not self.agent_jobs:
            return 0.0
        mean = self.agent_busy_s / self.agent_jobs
        share = self.agent_jobs / self.agent_workers
        return (math.ceil(share) - share) * mean

    @property
    def serial_jobs_per_s(self) -> float:
        """The reference's serial loop on the same work: a batch through phases I-III,
        then its rejects one by one through the agent, then the next batch (no overlap,
        one agent)."""
        total = self.fast_busy_s + self.agent_busy_s
        return self.jobs / total if total else 0.0


def bench_embedded(
    settings: Settings, corpus: Path, database_url: str, scripted: ScriptedSettings | None = None
) -> EmbeddedFigures:
    """Annotate ``corpus`` with the embedded runner under ``settings`` (the scripted
    backend as ``scripted`` says); time the run."""
    sessions = open_store(database_url)
    rows = read_source(corpus, "What colour is the image?")
    submitted = submit_corpus(sessions, rows, source=str(corpus), name="bench", settings=settings)
    runner = EmbeddedRunner(sessions, load_models(settings, scripted), settings)
    warm_up(settings.funnel.gate)  # a started service has paid this already
    result = runner.run(submitted.batch_id, poll_s=0.2)
    counts = result.counts
    with sessions() as session:
        busy = analytics.stage_busy(session, submitted.batch_id)
        draws = tuple(run_draws(session, submitted.batch_id))
    sessions.close()
    return EmbeddedFigures(
        jobs=result.finished_now,
        seconds=result.seconds,
        beta=counts.beta,
        alpha=counts.alpha,
        small_share=counts.small_share,
        fast_busy_s=busy.fast_s,
        agent_busy_s=busy.agent_s,
        agent_workers=settings.agent.workers,
        agent_jobs=busy.agent_jobs,
        fill_s=busy.fill_s,
        draws=draws,
    )


def funnel_and_baseline(
    jobs: int, scripted: ScriptedSettings, *, batch_size: int, agent_workers: int
) -> dict[str, EmbeddedFigures]:
    """The same scripted corpus run twice, through the funnel and with every job sent to
    the agent (the baseline), each on a scratch SQLite store."""
    figures = {}
    with tempfile.TemporaryDirectory() as scratch:
        corpus = Path(scratch) / "corpus"
        write_corpus(corpus, jobs)
        for label, is_baseline in (("funnel", False), ("baseline", True)):
            settings = Settings(
                backend="scripted",
                baseline=is_baseline,
                audit_rate=0.0,  # the funnel's own speed (the audit's cost is its rate)
                fast_batch_size=batch_size,
                agent_workers=agent_workers,
            )
            url = f"sqlite:///{Path(scratch) / label}.db"
            figures[label] = bench_embedded(settings, corpus, url, scripted)
    return figures
