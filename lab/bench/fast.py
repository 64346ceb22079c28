"""``speceyes bench fast``: the fast stage (phases I-III) against its batch size.

Every job is screened AND speculated, the fast stage's worst case, so a figure does not
depend on what a model happens to decide. The first calls are a warm-up (allocations,
kernel selection) and are not timed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from common.backends import Models
from common.config import FunnelSettings
from common.contracts import Query
from common.pipeline.funnel import gate_stage, screen_stage, speculate_stage


@dataclass(frozen=True)
class FastRow:
    """One batch size: the seconds each phase took over all the queries."""

    batch_size: int
    jobs: int
    screen_s: float
    speculate_s: float
    gate_s: float

    @property
    def jobs_per_s(self) -> float:
        total = self.screen_s + self.speculate_s + self.gate_s
        return self.jobs / total if total else 0.0


def bench_fast(
    models: Models, queries: list[Query], sizes: Sequence[int], funnel: FunnelSettings
) -> Iterator[FastRow]:
    """Phases I-III over ``queries`` in batches of each size, one row per size."""
    screen_tokens, gate = funnel.screen_max_new_tokens, funnel.gate
    screen_stage(queries[:2], models.large, max_new_tokens=screen_tokens)  # warm-up
    speculate_stage(queries[:2], models.small, max_new_tokens=4, top_k=gate.top_k)
    for size in sizes:
        seconds = {"screen": 0.0, "speculate": 0.0, "gate": 0.0}
        for start in range(0, len(queries), size):
            batch = queries[start : start + size]
            began = time.perf_counter()
            screen_stage(batch, models.large, max_new_tokens=screen_tokens)
            seconds["screen"] += time.perf_counter() - began
            began = time.perf_counter()
            answers = speculate_stage(
                batch,
                models.small,
                max_new_tokens=funnel.speculate_max_new_tokens,
                top_k=gate.top_k,
            )
            seconds["speculate"] += time.perf_counter() - began
            began = time.perf_counter()
            gate_stage([a for a in answers if not isinstance(a, Exception)], gate)
            seconds["gate"] += time.perf_counter() - began
        yield FastRow(size, len(queries), seconds["screen"], seconds["speculate"], seconds["gate"])
