"""What each job of a micro-batch cost (``Usage``): a batched call's wall time shared
equally by the jobs it ran, and each job's own tokens read and written.

The fast stage's phases run batched, so a job's screen is its batch's screen time over
the jobs screened, its speculation the speculate time over the jobs speculated (their
zooms included, at depth >= 1), its gate the gate time over the answers gated. The
agent's time is each job's own (``Trajectory.usage``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from common.backends.base import Speculation
from common.contracts import Phase, Query, ScreenResult, Usage
from common.errors import ModelError


class Meter:
    """The jobs of one micro-batch and what each used so far."""

    def __init__(self) -> None:
        self.jobs: dict[str, Usage] = {}

    def share(self, phase: Phase, seconds: float, queries: Sequence[Query]) -> None:
        """``seconds`` of one batched phase, shared by the ``queries`` it ran."""
        for query in queries:
            self.of(query.job_id).add(phase, seconds / len(queries))

    def screens(self, queries: Sequence[Query], screens: Iterable[Any]) -> None:
        """The tokens each screen read and wrote."""
        for query, screen in zip(queries, screens, strict=True):
            if isinstance(screen, ScreenResult):
                self.of(query.job_id).add(
                    Phase.SCREEN, 0.0, screen.prompt_tokens, screen.new_tokens
                )

    def speculations(
        self,
        queries: Sequence[Query],
        speculations: Iterable[Speculation | ModelError | None],
        zooms: dict[str, tuple[dict[str, Any], ...]],
    ) -> None:
        """The tokens each speculation read and wrote, its zooms' turns included."""
        for query, speculation in zip(queries, speculations, strict=True):
            usage = self.of(query.job_id)
            for turn in zooms.get(query.job_id, ()):
                usage.add(
                    Phase.SPECULATE, 0.0, _count(turn, "prompt_tokens"), _count(turn, "new_tokens")
                )
            if isinstance(speculation, Speculation):
                written = len(speculation.scores.top_values)
                usage.add(Phase.SPECULATE, 0.0, speculation.prompt_tokens, written)

    def of(self, job_id: str) -> Usage:
        return self.jobs.setdefault(job_id, Usage())


def _count(turn: dict[str, Any], name: str) -> int:
    value = turn.get(name)
    return value if isinstance(value, int) and value >= 0 else 0
