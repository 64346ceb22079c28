"""``speceyes annotate --estimate N``: the funnel on a random sample of a corpus, and
what the whole corpus would take on this deployment (``common.store.usage``).

The sample's rows are drawn uniformly (reservoir sampling: one pass over the rows, none
decoded), kept in their order, and run as a batch of their own named ``NAME.estimate``
(its config and key say it is one: the corpus's own run makes its own batch). Its jobs
are the corpus's: the full run later finds them done and does not run them again.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from common.contracts import AnsweredBy, JobStatus, SourceRow
from common.scores import wilson
from common.store.analytics import STRICT_COUNTS
from common.store.overview import overview
from common.store.reads import batch_counts
from common.store.usage import Z_95, project

# two runs of the same rows on a shared machine took up to this much longer one than the
# other (2 cores, twice the load): both ends of the wall-time interval allow for it
WALL_NOISE = 0.25

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker


@dataclass
class Sample:
    """The rows drawn, and how many the corpus has (counted while drawing)."""

    rows: list[SourceRow]
    population: int

    def marker(self, seed: int) -> dict[str, Any]:
        """What the sample's batch says it is (in its config and key: the corpus's own
        run is another batch, whichever rows were drawn)."""
        return {"estimate": {"sample": len(self.rows), "rows": self.population, "seed": seed}}


def draw(rows: Iterable[SourceRow], size: int, seed: int) -> Sample:
    """``size`` rows drawn uniformly from ``rows`` in one pass (Algorithm R), in their
    order in the corpus."""
    chosen = random.Random(seed)
    kept: list[SourceRow] = []
    seen = 0
    for row in rows:
        seen += 1
        if len(kept) < size:
            kept.append(row)
            continue
        slot = chosen.randrange(seen)
        if slot < size:
            kept[slot] = row
    return Sample(sorted(kept, key=lambda row: row.position), seen)


def print_estimate(
    sessions: sessionmaker[Session],
    batch_id: str,
    sample: Sample,
    wall_s: float,
    concurrency: int,
) -> dict[str, Any]:
    """Print what the sample says of the whole corpus; returns the figures printed.

    The wall time is the model time at a pace between two: the sample's own (its wall
    seconds per model second: a sample's stages overlap less than a corpus's, so this is
    the slow end) and every one of the deployment's ``concurrency`` model callers busy
    at once (the fast end); the middle is the estimate."""
    with sessions() as session:
        counts = batch_counts(session, batch_id)
        found = overview(session, batch_id, counts)
    usage, rows, measured = found.usage, sample.population, len(sample.rows)
    finished = counts.by_status[JobStatus.DONE] + counts.by_status[JobStatus.FAILED]
    figures: dict[str, Any] = {
        "rows": rows,
        "sample": measured,
        "beta": counts.beta,
        "alpha": counts.alpha,
        "accepted": wilson(counts.by_answerer[AnsweredBy.SMALL], finished, Z_95)
        if finished
        else None,
        "accepted_share": counts.by_answerer[AnsweredBy.SMALL] / finished if finished else None,
    }
    compute = project(usage.per_job, rows)
    figures["compute"] = compute
    figures["wall"] = None
    if compute is not None and usage.spent.total_s > 0:
        slow = max(wall_s / usage.spent.total_s, 1 / concurrency)
        low = compute.low / concurrency / (1 + WALL_NOISE)
        high = compute.high * slow * (1 + WALL_NOISE)
        figures["wall"] = ((low + high) / 2, low, high)
    if found.scored:
        figures["accuracy"] = (
            found.correct / found.scored,
            *wilson(found.correct, found.scored, Z_95),
        )
    print(f"\nestimate from {measured} of {rows} rows, drawn at random (95% intervals):")
    for label, key in (("beta (screened tool-free)", "beta"), ("alpha (accepted)", "alpha")):
        value = figures[key]
        print(f"  {label:<28} {'-' if value is None else f'{value:.2f}'}")
    share = figures["accepted_share"]
    if share is not None:
        low, high = figures["accepted"]
        print(f"  {'answered by the small model':<28} {share:.1%} ({low:.1%} to {high:.1%})")
    if compute is None:
        print("  model time and wall time: too few rows finished to say")
    else:
        print(
            f"  {'model time, whole corpus':<28} {_hours(compute.value)} "
            f"({_hours(compute.low)} to {_hours(compute.high)})"
        )
        if figures["wall"] is not None:
            value, low, high = figures["wall"]
            print(
                f"  {'wall time on this deployment':<28} {_hours(value)} "
                f"({_hours(low)} with its {concurrency} model callers all busy, to "
                f"{_hours(high)} at the sample's pace)"
            )
    if "accuracy" in figures:
        value, low, high = figures["accuracy"]
        print(f"  {'accuracy (known answers)':<28} {value:.1%} ({low:.1%} to {high:.1%})")
        print(f"  {'':<28} by {STRICT_COUNTS}")
    print(f"the sample's jobs are kept (batch {batch_id}); the full run reuses them")
    return figures


def _hours(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
