"""``speceyes bench fast``: the fast stage (phases I-III) against its batch size.

Every job is screened AND speculated, the fast stage's worst case, so a figure does not
depend on what a model happens to decide. At a speculation depth D >= 1 the small model
zooms as it decides (up to D times a job, in lockstep: ``common.pipeline.depth``); the
row says how many zooms it made. The first calls are a warm-up (allocations, kernel
selection) and are not timed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from common.backends import Models
from common.backends.base import Speculation
from common.config import FunnelSettings
from common.contracts import Query
from common.pipeline.depth import speculate_in_depth
from common.pipeline.funnel import gate_stage, screen_stage, speculate_stage


@dataclass(frozen=True)
class FastRow:
    """One batch size at one depth: the seconds each phase took over all the queries,
    and the small model's zooms (depth >= 1)."""

    batch_size: int
    jobs: int
    screen_s: float
    speculate_s: float
    gate_s: float
    depth: int = 0
    zooms: int = 0

    @property
    def jobs_per_s(self) -> float:
        total = self.screen_s + self.speculate_s + self.gate_s
        return self.jobs / total if total else 0.0


def bench_fast(
    models: Models,
    queries: list[Query],
    sizes: Sequence[int],
    funnel: FunnelSettings,
    depths: Sequence[int] = (0,),
) -> Iterator[FastRow]:
    """Phases I-III over ``queries`` in batches of each size, one row per depth and size."""
    screen_tokens, gate = funnel.screen_max_new_tokens, funnel.gate
    screen_stage(queries[:2], models.large, max_new_tokens=screen_tokens)  # warm-up
    speculate_stage(queries[:2], models.small, max_new_tokens=4, top_k=gate.top_k)
    for depth in depths:
        for size in sizes:
            seconds = {"screen": 0.0, "speculate": 0.0, "gate": 0.0}
            zooms = 0
            for start in range(0, len(queries), size):
                batch = queries[start : start + size]
                began = time.perf_counter()
                screen_stage(batch, models.large, max_new_tokens=screen_tokens)
                seconds["screen"] += time.perf_counter() - began
                began = time.perf_counter()
                answers, made = _speculate(batch, models, funnel, depth)
                seconds["speculate"] += time.perf_counter() - began
                zooms += made
                began = time.perf_counter()
                gate_stage(answers, gate)
                seconds["gate"] += time.perf_counter() - began
            yield FastRow(
                size,
                len(queries),
                seconds["screen"],
                seconds["speculate"],
                seconds["gate"],
                depth,
                zooms,
            )


def _speculate(
    batch: list[Query], models: Models, funnel: FunnelSettings, depth: int
) -> tuple[list[Speculation], int]:
    """Phase II at ``depth``: the answers the gate reads, and the zooms made."""
    if depth == 0:
        answers = speculate_stage(
            batch,
            models.small,
            max_new_tokens=funnel.speculate_max_new_tokens,
            top_k=funnel.gate.top_k,
        )
        return [a for a in answers if isinstance(a, Speculation)], 0
    found = speculate_in_depth(
        batch,
        models.small,
        depth=depth,
        max_new_tokens=funnel.zoom_max_new_tokens,
        top_k=funnel.gate.top_k,
    )
    zooms = sum(step.box_original is not None for job in found for step in job.steps)
    return [job.speculation for job in found if job.speculation is not None], zooms
