"""Inputs for benchmarks: synthetic queries that look like the real workload."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw

from common.backends.scripted import ScriptedSettings
from common.config import Settings
from common.contracts import Query
from lab.schedule import Draw, run_draws

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (230, 200, 40),
}
SHAPES = ("circle", "square")


def synthetic_queries(count: int, width: int, height: int, seed: int = 0) -> list[Query]:
    """``count`` images of one coloured shape each, with a colour question (half of them
    multiple choice). Deterministic in ``seed``."""
    rng = random.Random(seed)
    names = list(COLOURS)
    queries = []
    for index in range(count):
        colour, shape = rng.choice(names), rng.choice(SHAPES)
        image = Image.new("RGB", (width, height), (235, 235, 235))
        size = rng.randint(min(width, height) // 8, min(width, height) // 3)
        left, top = rng.randint(0, width - size), rng.randint(0, height - size)
        draw = ImageDraw.Draw(image)
        box = (left, top, left + size, top + size)
        (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=COLOURS[colour])
        question = f"What is the colour of the {shape}?"
        options = tuple(rng.sample(names, len(names))) if index % 2 else None
        queries.append(Query(f"bench-{index}", image, question, options))
    return queries


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
    draws: tuple[Draw, ...] = ()  # where each job went, in submission order (lab.schedule)

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


def write_corpus(folder: Path, count: int) -> None:
    """``count`` small distinct PNG files (distinct bytes make distinct jobs)."""
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        colour = (index % 251, index // 251 % 251, 120)
        Image.new("RGB", (32, 32), colour).save(folder / f"{index:06d}.png")


def bench_embedded(
    settings: Settings, corpus: Path, database_url: str, scripted: ScriptedSettings | None = None
) -> EmbeddedFigures:
    """Annotate ``corpus`` with the embedded runner under ``settings`` (the scripted
    backend as ``scripted`` says); time the run."""
    from common.backends import load_models
    from common.corpus import read_source
    from common.gate import warm_up
    from common.runner import EmbeddedRunner
    from common.store import analytics
    from common.store.db import open_store
    from common.submit import submit_corpus

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
