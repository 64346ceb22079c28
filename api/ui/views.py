"""What the review pages draw, computed from the store's read models: the funnel's
stages, the confidence histogram's bars, the gate's token bars, a job's phase timings and
verdicts. Plain data for the templates (which only lay it out)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from api.browse import zoom_box_of
from common.protocols.scoring import is_correct, reference_verdict
from common.store.overview import HISTOGRAM_BINS, Histogram
from common.store.reads import BatchCounts
from common.store.tables import BatchItem, Job

CHART_W, CHART_H = 600, 160  # the histogram's drawing, in SVG units


@dataclass(frozen=True)
class FunnelStage:
    label: str
    count: int
    share: float | None  # of all jobs


def funnel(counts: BatchCounts) -> list[FunnelStage]:
    """jobs -> screened tool-free -> speculated -> accepted; the rest -> agent."""
    total = counts.jobs

    def stage(label: str, count: int) -> FunnelStage:
        return FunnelStage(label, count, count / total if total else None)

    return [
        stage("jobs", total),
        stage("screened tool-free", counts.screened_tool_free),
        stage("speculated", counts.speculated),
        stage("accepted", counts.accepted),
        stage("to the agent", sum(counts.by_defer_reason.values())),
    ]


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    kind: str  # accepted_right, deferred_wrong, ... (its CSS class)
    count: int
    low: float  # the bin's confidence range
    high: float


def histogram_bars(histogram: Histogram) -> list[Bar]:
    """Stacked bars, one stack per bin, scaled to the tallest stack."""
    tallest = histogram.tallest or 1
    width = CHART_W / HISTOGRAM_BINS
    bars = []
    for index in range(HISTOGRAM_BINS):
        top = float(CHART_H)
        for kind, series in histogram.bins.items():
            count = series[index]
            if not count:
                continue
            height = CHART_H * count / tallest
            top -= height
            low = index / HISTOGRAM_BINS
            bars.append(
                Bar(
                    index * width + 1,
                    top,
                    width - 2,
                    height,
                    kind,
                    count,
                    low,
                    low + 1 / HISTOGRAM_BINS,
                )
            )
    return bars


def threshold_x(threshold: float | None) -> float | None:
    return None if threshold is None else CHART_W * min(1.0, max(0.0, threshold))


@dataclass(frozen=True)
class TokenBar:
    score: float
    width: float  # of 100


def token_bars(job: Job) -> list[TokenBar]:
    scores = job.token_scores if isinstance(job.token_scores, list) else []
    return [
        TokenBar(float(score), 100 * min(1.0, max(0.0, float(score))))
        for score in scores
        if isinstance(score, int | float) and not isinstance(score, bool) and score == score
    ]


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float | None


def phases(job: Job) -> list[Phase]:
    """Queue wait, the fast stage, the wait for the agent, the agent."""

    def between(start: datetime | None, end: datetime | None) -> float | None:
        return (end - start).total_seconds() if start and end else None

    agent_end = job.finished_at if job.agent_started_at else None
    fast_end = job.gated_at or (job.finished_at if not job.agent_started_at else None)
    return [
        Phase("queued", between(job.created_at, job.fast_started_at)),
        Phase("fast stage (screen, speculate, gate)", between(job.fast_started_at, fast_end)),
        Phase("waited for the agent", between(job.gated_at, job.agent_started_at)),
        Phase("agent", between(job.agent_started_at, agent_end)),
        Phase("in all", between(job.created_at, job.finished_at)),
    ]


@dataclass(frozen=True)
class Verdicts:
    strict: bool | None
    reference: bool | None
    judge: bool | None


def verdicts(item: BatchItem | None, job: Job) -> Verdicts:
    """The model's answer against the row's expected answer: by our rules, by the
    reference's (benchmark rows) and by its LLM judge, where each has one."""
    if item is None or item.expected is None:
        return Verdicts(None, None, None)
    strict = is_correct(job.final_answer, item.expected, job.options)
    reference = None
    if item.split and job.scored_text is not None:  # (a failed answer the reference scores)
        benchmark = item.split.split("/")[0]
        reference = reference_verdict(benchmark, job.scored_text, item.expected, job.options)
    return Verdicts(strict, reference, item.judge_verdict)


@dataclass(frozen=True)
class Zoom:
    """A DeepEyes step's zoom: its box on the image (corners in order) and the crop."""

    step: int
    x: int
    y: int
    width: int
    height: int


def zooms(job: Job, *, small: bool = False) -> dict[int, Zoom]:
    """The zoom boxes of the agent's steps (``small``: the small model's), by step."""
    found = {}
    for index in range(len((job.small_steps if small else job.trace_steps) or [])):
        box = zoom_box_of(job, index, small=small)
        if box is not None:
            (x1, x2), (y1, y2) = sorted((box[0], box[2])), sorted((box[1], box[3]))
            found[index] = Zoom(index, x1, y1, x2 - x1, y2 - y1)
    return found


THUMBNAIL_PREFIX = "data:image/png;base64,"


def produced_images(step: dict[str, Any]) -> list[dict[str, Any]]:
    """A Thyme step's images, as its trace keeps them: only PNG thumbnails we encoded
    (anything else in the trace is not shown)."""
    images = step.get("images")
    if not isinstance(images, list):
        return []
    return [
        image
        for image in images
        if isinstance(image, dict)
        and isinstance(image.get("thumbnail"), str)
        and image["thumbnail"].startswith(THUMBNAIL_PREFIX)
    ]
