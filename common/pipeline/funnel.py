"""The SpecEyes funnel as plain functions over batches.

Every runner (the embedded runner, the Celery tasks, the benchmarks) calls these; none
of them holds model math of its own. In order:

1. ``prepare_query``: decode and validate a job's image (a bad image fails that job);
2. ``screen_stage`` (phase I): does the job need tools? one batched call of the screener;
3. ``speculate_stage`` (phase II): the small model answers the tool-free jobs, batched
   (at ``speculation_depth`` D >= 1 it may zoom up to D times first:
   ``common.pipeline.depth``);
4. ``gate_stage`` (phase III): answer separability accepts or defers each answer;
5. ``run_fast_stage`` chains 2-4 over one micro-batch: each job ends ``Accepted``,
   ``Deferred`` (with the reason) or ``Failed``;
6. ``run_agent_stage`` (phase IV): one deferred job through the agent loop.

A model call that raises is retried on halves of its batch until the failing job stands
alone, so one bad job never fails the others; retryable errors (a model server down)
propagate for the runner to retry the whole batch later.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from common.agents.deepeyes import run_deepeyes
from common.agents.specreason import run_specreason
from common.agents.thyme import run_thyme
from common.agents.trajectory import Trajectory
from common.backends.base import Speculation, VisionLanguageModel
from common.config import AgentSettings, FunnelSettings, GateSettings, ImageSettings
from common.contracts import (
    Accepted,
    AgentOutcome,
    DeferReason,
    Deferred,
    Failed,
    FailureCode,
    FastOutcome,
    Phase,
    Query,
    ScreenResult,
    Usage,
)
from common.errors import ImageError, ModelError, RetryableError, StopRequested
from common.images import content_hash, decode_image
from common.pipeline.depth import speculate_in_depth
from common.pipeline.gate import score_answers
from common.pipeline.isolation import per_job
from common.pipeline.metering import Meter
from common.scores import REPLAY_K, DepthReplay, GateResult
from common.sources.locations import describe
from common.sources.reading import read_located

log = logging.getLogger(__name__)


@dataclass
class FastBatchResult:
    outcomes: list[FastOutcome]  # one per query, in order
    seconds: dict[str, float] = field(default_factory=dict)  # per phase, for the batch
    usage: dict[str, Usage] = field(default_factory=dict)  # per job (common.pipeline.metering)


def prepare_query(
    job_id: str,
    image_path: str,
    question: str,
    options: Sequence[str] | None = None,
    limits: ImageSettings | None = None,
    expected_hash: str | None = None,
    shown_path: str | None = None,
) -> Query | Failed:
    """Load a job's image into a ``Query``, or fail the job with the reason.

    With ``expected_hash``, an image file that changed since the job was submitted fails
    the job rather than answering a question about other pixels.
    """
    limits = limits or ImageSettings()
    where = describe(image_path)
    try:
        data = read_located(image_path, limits)
        if expected_hash is not None and content_hash(data) != expected_hash:
            return Failed(
                job_id, FailureCode.IMAGE_CHANGED, f"{where} changed since it was submitted"
            )
        image = decode_image(data, limits)
    except ImageError as exc:
        return Failed(job_id, exc.code, f"{where}: {exc}")
    options_ = tuple(options) if options else None
    return Query(job_id, image, question, options_, image_path, shown_path)


def screen_stage(
    queries: list[Query], model: VisionLanguageModel, *, max_new_tokens: int
) -> list[ScreenResult | ModelError]:
    """Phase I over a batch."""
    return per_job(lambda batch: model.screen(batch, max_new_tokens=max_new_tokens), queries)


def speculate_stage(
    queries: list[Query], model: VisionLanguageModel, *, max_new_tokens: int, top_k: int
) -> list[Speculation | ModelError]:
    """Phase II over a batch."""
    return per_job(
        lambda batch: model.speculate(batch, max_new_tokens=max_new_tokens, top_k=top_k), queries
    )


def gate_stage(speculations: Sequence[Speculation], gate: GateSettings) -> list[GateResult]:
    """Phase III over a batch."""
    return score_answers([s.scores for s in speculations], gate)


def run_fast_stage(
    queries: list[Query],
    *,
    large: VisionLanguageModel,
    small: VisionLanguageModel,
    settings: FunnelSettings,
    on_screened: Callable[[list[Deferred]], None] | None = None,
    limits: AgentSettings | None = None,
    meter: Meter | None = None,
) -> FastBatchResult:
    """Phases I-III over one micro-batch; one outcome per query, in order.

    ``on_screened`` receives the jobs screening sent to the agent as soon as phase I is
    over, so that they need not wait for phases II-III of their batch-mates. ``limits``:
    the agent's box rules, which the small model's zooms follow (speculation in depth).
    ``meter``: where each job's usage goes (the result's ``usage``; a caller that records
    screened jobs early passes its own, to read theirs by then).
    """
    if settings.baseline:
        return FastBatchResult([Deferred(q.job_id, DeferReason.BASELINE) for q in queries])
    if settings.calibrate:
        return _calibration_batch(
            queries, large=large, small=small, settings=settings, limits=limits, meter=meter
        )
    meter = meter or Meter()
    result = FastBatchResult([], usage=meter.jobs)
    outcomes: dict[str, FastOutcome] = {}
    screens: dict[str, ScreenResult] = {}
    # at depth >= 1 with scope 'all', a job the screen says needs tools zooms as well
    zoom_all = settings.speculation_depth > 0 and settings.depth_scope == "all"
    if settings.screener != "none":
        started = time.perf_counter()
        screener = large if settings.screener == "large" else small
        results = screen_stage(queries, screener, max_new_tokens=settings.screen_max_new_tokens)
        for query, screen in zip(queries, results, strict=True):
            if isinstance(screen, ModelError):
                outcomes[query.job_id] = Deferred(
                    query.job_id, DeferReason.SCREEN_ERROR, detail=str(screen)
                )
                continue
            screens[query.job_id] = screen
            if screen.needs_tools and not zoom_all:
                outcomes[query.job_id] = Deferred(query.job_id, DeferReason.TOOLS_NEEDED, screen)
        result.seconds["screen"] = time.perf_counter() - started
        meter.share(Phase.SCREEN, result.seconds["screen"], queries)
        meter.screens(queries, results)
        early = [o for o in outcomes.values() if isinstance(o, Deferred)]
        if on_screened is not None and early:
            on_screened(early)

    tool_free = [q for q in queries if q.job_id not in outcomes]
    started = time.perf_counter()
    speculations: Sequence[Speculation | ModelError | None]
    if settings.speculation_depth:
        speculations, traces = _speculate_in_depth(
            tool_free, small, settings, outcomes, screens, limits
        )
    else:
        speculations = speculate_stage(
            tool_free,
            small,
            max_new_tokens=settings.speculate_max_new_tokens,
            top_k=settings.gate.top_k,
        )
        traces = {}
    result.seconds["speculate"] = time.perf_counter() - started
    if tool_free:
        meter.share(Phase.SPECULATE, result.seconds["speculate"], tool_free)
        meter.speculations(tool_free, speculations, traces)
    answered: list[tuple[Query, Speculation]] = []
    for query, speculation in zip(tool_free, speculations, strict=True):
        if isinstance(speculation, ModelError):
            outcomes[query.job_id] = Deferred(
                query.job_id,
                DeferReason.SMALL_MODEL_ERROR,
                screens.get(query.job_id),
                detail=str(speculation),
                zoom_steps=traces.get(query.job_id, ()),
            )
        elif speculation is not None:
            answered.append((query, speculation))

    started = time.perf_counter()
    verdicts = gate_stage([speculation for _, speculation in answered], settings.gate)
    result.seconds["gate"] = time.perf_counter() - started
    if answered:
        meter.share(Phase.GATE, result.seconds["gate"], [query for query, _ in answered])
    for (query, speculation), verdict in zip(answered, verdicts, strict=True):
        screened = screens.get(query.job_id)
        zoomed = traces.get(query.job_id, ())
        outcomes[query.job_id] = (
            Accepted(
                query.job_id,
                speculation.answer,
                verdict.confidence,
                verdict.token_scores,
                screened,
                zoomed,
            )
            if verdict.accepted
            else Deferred(
                query.job_id,
                DeferReason.LOW_CONFIDENCE,
                screened,
                speculation.answer,
                verdict.confidence,
                zoom_steps=zoomed,
            )
        )
    result.outcomes = [outcomes[q.job_id] for q in queries]
    return result


def _speculate_in_depth(
    queries: list[Query],
    small: VisionLanguageModel,
    settings: FunnelSettings,
    outcomes: dict[str, FastOutcome],
    screens: dict[str, ScreenResult],
    limits: AgentSettings | None,
) -> tuple[list[Speculation | ModelError | None], dict[str, tuple[dict[str, Any], ...]]]:
    """Phase II at depth D >= 1 (``common.pipeline.depth``): each job's answer, its error,
    or None where it was deferred (its outcome is set here); and each job's zoom steps."""
    speculations: list[Speculation | ModelError | None] = []
    traces = {}
    zoomed = speculate_in_depth(
        queries,
        small,
        depth=settings.speculation_depth,
        max_new_tokens=settings.zoom_max_new_tokens,
        top_k=settings.gate.top_k,
        limits=limits,
        max_pixels=settings.fast_batch_pixels,
    )
    for query, found in zip(queries, zoomed, strict=True):
        traces[query.job_id] = found.trace
        if found.defer is not None:
            outcomes[query.job_id] = Deferred(
                query.job_id,
                found.defer,
                screens.get(query.job_id),
                detail=found.detail,
                zoom_steps=found.trace,
            )
        speculations.append(found.error or found.speculation)
    return speculations, traces


def _calibration_batch(
    queries: list[Query],
    *,
    large: VisionLanguageModel,
    small: VisionLanguageModel,
    settings: FunnelSettings,
    limits: AgentSettings | None = None,
    meter: Meter | None = None,
) -> FastBatchResult:
    """A calibration run's fast stage: every job is screened (when there is a screener)
    and speculated, keeping the top ``REPLAY_K`` logits per answer token, gated as the
    settings say (for the record), and then sent to the agent whatever the gate said.

    At speculation depth D >= 1 every job also speculates in depth, whatever the screen
    said, and keeps what replaying each depth d <= D needs (``DepthReplay``): the live
    depth-0 answer above stays the record's depth 0."""
    meter = meter or Meter()
    result = FastBatchResult([], usage=meter.jobs)
    screens: dict[str, ScreenResult] = {}
    if settings.screener != "none":
        started = time.perf_counter()
        screener = large if settings.screener == "large" else small
        results = screen_stage(queries, screener, max_new_tokens=settings.screen_max_new_tokens)
        screens = {
            q.job_id: s
            for q, s in zip(queries, results, strict=True)
            if not isinstance(s, ModelError)
        }
        result.seconds["screen"] = time.perf_counter() - started
        meter.share(Phase.SCREEN, result.seconds["screen"], queries)
        meter.screens(queries, results)
    started = time.perf_counter()
    top_k = max(settings.gate.top_k, REPLAY_K)
    speculations = speculate_stage(
        queries, small, max_new_tokens=settings.speculate_max_new_tokens, top_k=top_k
    )
    result.seconds["speculate"] = time.perf_counter() - started
    depth = _depth_replays(queries, small, settings, limits, result.seconds) or {}
    if queries:
        spent = result.seconds["speculate"] + result.seconds.get("zoom", 0.0)
        meter.share(Phase.SPECULATE, spent, queries)
        meter.speculations(queries, speculations, {j: zoomed for j, (zoomed, _) in depth.items()})
    answered = [s for s in speculations if not isinstance(s, ModelError)]
    verdicts = iter(gate_stage(answered, settings.gate))
    for query, speculation in zip(queries, speculations, strict=True):
        screen = screens.get(query.job_id)
        zoomed, replayed = depth.get(query.job_id, ((), None))
        if isinstance(speculation, ModelError):
            result.outcomes.append(
                Deferred(
                    query.job_id,
                    DeferReason.CALIBRATION,
                    screen,
                    detail=str(speculation),
                    zoom_steps=zoomed,
                    depth_replay=replayed,
                )
            )
            continue
        verdict = next(verdicts)
        result.outcomes.append(
            Deferred(
                query.job_id,
                DeferReason.CALIBRATION,
                screen,
                speculation.answer,
                verdict.confidence,
                replay=speculation.scores,
                zoom_steps=zoomed,
                depth_replay=replayed,
            )
        )
    return result


def _depth_replays(
    queries: list[Query],
    small: VisionLanguageModel,
    settings: FunnelSettings,
    limits: AgentSettings | None,
    seconds: dict[str, float],
) -> dict[str, tuple[tuple[dict[str, Any], ...], DepthReplay]] | None:
    """A calibration run's speculation in depth (None at depth 0): per job, its zoom
    steps and its ``DepthReplay``; ``seconds`` gains the phase's time ("zoom")."""
    if not settings.speculation_depth or not queries:
        return None
    started = time.perf_counter()
    zoomed = speculate_in_depth(
        queries,
        small,
        depth=settings.speculation_depth,
        max_new_tokens=settings.zoom_max_new_tokens,
        top_k=max(settings.gate.top_k, REPLAY_K),
        limits=limits,
        max_pixels=settings.fast_batch_pixels,
    )
    seconds["zoom"] = time.perf_counter() - started
    share = {phase: seconds.get(phase, 0.0) / len(queries) for phase in ("screen", "speculate")}
    found = {}
    for query, job in zip(queries, zoomed, strict=True):
        answer = job.speculation
        replayed = DepthReplay(
            depth=settings.speculation_depth,
            zooms=None if answer is None else len(job.steps) - 1,
            answer=None if answer is None else answer.answer,
            scores=None if answer is None else answer.scores,
            round_seconds=[step.generate_seconds + step.tool_seconds for step in job.steps],
            round_tokens=[step.new_tokens for step in job.steps],
            screen_seconds=share["screen"],
            speculate_seconds=share["speculate"],
        )
        found[query.job_id] = (job.trace, replayed)
    return found


def run_agent_stage(
    query: Query,
    large: VisionLanguageModel,
    limits: AgentSettings | None = None,
    *,
    specreason: tuple[VisionLanguageModel, float] | None = None,
) -> AgentOutcome:
    """Phase IV for one job: a final answer, or a clear error (never a guess).
    ``specreason`` (the small model, the score threshold): the job runs SpecReason
    (``common.agents.specreason``) instead of the agent alone."""
    limits = limits or AgentSettings()
    agent = run_thyme if limits.kind == "thyme" else run_deepeyes
    # a model that batches concurrent trajectories' steps (backends.lockstep) is told
    # that one is in flight; any other model has nothing to count
    in_flight = getattr(large, "trajectory", nullcontext)()
    try:
        with in_flight:
            if specreason is None:
                trajectory = agent(query, large, limits)
            else:
                small, threshold = specreason
                trajectory = run_specreason(query, large, small, limits, threshold=threshold)
    except (RetryableError, StopRequested):
        raise
    except Exception as exc:
        log.warning("agent failed on job %s: %s", query.job_id, exc)
        log.info("the agent's traceback", exc_info=True)  # (with -v)
        return AgentOutcome(
            query.job_id,
            None,
            Trajectory(),
            FailureCode.MODEL_ERROR,
            f"{type(exc).__name__}: {exc}",
        )
    return AgentOutcome(
        query.job_id, trajectory.answer, trajectory, trajectory.error_code, trajectory.error
    )
