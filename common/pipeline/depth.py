"""Speculation in depth: the small model may zoom up to D times before the gate decides.

At ``funnel.speculation_depth`` D >= 1, phase II shows the small model what phase IV
shows the agent (its protocol's DeepEyes tool prompt and first turn) and runs the turns
of a whole micro-batch in lockstep: each round is ONE batched ``agent_turns`` over the
jobs still zooming; each zoom is cropped as the agent's are (``common.agents.deepeyes``:
the same box mapping, crop rules and grid). A job leaves the loop:

- with an answer: the first closed ``<answer>`` before any call, at any round; the gate
  then scores that answer's tokens only (``answer_scores``);
- deferred ``zoom_invalid``: a turn with neither a call nor an answer, a call that does
  not parse, a box the agent would refuse, a crop that cannot be shown, an answer the
  agent's loop would refuse (empty, or holding the protocol's tags);
- deferred ``depth_exhausted``: it called the tool again at round D + 1;
- with the model's error (its call raised for that job alone).

What hostile output can cost is bounded before it is touched: a turn is at most
``zoom_max_new_tokens`` tokens and stops at the first ``</tool_call>`` (a thousand
calls in one turn are one call), only the first call is read, a box is clamped to the
image before a crop, and a job has at most D crops. None of it raises outside its job.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from common.agents.deepeyes import (
    ToolError,
    TrajectoryError,
    map_box,
    parse_answer,
    parse_tool_call,
)
from common.agents.trajectory import AgentStep, answer_problem
from common.backends.base import Generation, Speculation, VisionLanguageModel, answer_scores
from common.chat import Conversation
from common.config import AgentSettings
from common.contracts import DeferReason, Query
from common.errors import ImageError, ModelError
from common.images import budget_groups
from common.pipeline.isolation import per_job


@dataclass
class Zoomed:
    """One job's speculation in depth: its answer (with the scores the gate reads) or why
    it was deferred, and the steps it took."""

    job_id: str
    speculation: Speculation | None = None
    defer: DeferReason | None = None
    detail: str = ""
    error: ModelError | None = None
    steps: list[AgentStep] = field(default_factory=list)

    @property
    def trace(self) -> tuple[dict[str, Any], ...]:
        return tuple(asdict(step) for step in self.steps)


def speculate_in_depth(
    queries: Sequence[Query],
    small: VisionLanguageModel,
    *,
    depth: int,
    max_new_tokens: int,
    top_k: int,
    limits: AgentSettings | None = None,
    max_pixels: int | None = None,
) -> list[Zoomed]:
    """Up to ``depth`` zooms per job, then an answer; one ``Zoomed`` per query, in order.

    ``max_pixels``: the most image pixels one call is shown (each conversation's image
    and its crops so far, as the model sees them); a round whose conversations hold more
    runs as several calls (a conversation over it alone)."""
    limits = limits or AgentSettings()
    protocol = small.protocol
    results = {query.job_id: Zoomed(query.job_id) for query in queries}
    talks = {}
    for query in queries:
        conversation = Conversation(key=query.job_id)
        conversation.messages += protocol.agent_start(
            protocol.view(query.image), query.question, query.options
        )
        talks[query.job_id] = conversation
    waiting = list(queries)
    for round_ in range(depth + 1):
        if not waiting:
            break
        started = time.perf_counter()
        generations: list[Generation | ModelError] = []
        for group in _groups(waiting, talks, max_pixels):
            answered = per_job(
                lambda batch: small.agent_turns(
                    [talks[query.job_id] for query in batch],
                    max_new_tokens=max_new_tokens,
                    top_k=top_k,
                ),
                group,
            )
            generations.extend(answered)
        seconds = (time.perf_counter() - started) / len(waiting)
        still = []
        for query, generation in zip(waiting, generations, strict=True):
            zoomed = results[query.job_id]
            if isinstance(generation, ModelError):
                zoomed.error = generation
                continue
            if _react(
                zoomed,
                query,
                generation,
                talks[query.job_id],
                small,
                limits,
                round_ == depth,
                seconds,
            ):
                still.append(query)
        waiting = still
    return [results[query.job_id] for query in queries]


def _groups(
    waiting: list[Query], talks: dict[str, Conversation], max_pixels: int | None
) -> list[list[Query]]:
    """The round's jobs in order, in groups whose conversations' images hold at most
    ``max_pixels`` together (a job over it alone)."""
    if max_pixels is None:
        return [waiting]

    def pixels_of(query: Query) -> int:
        return sum(image.width * image.height for image in talks[query.job_id].images)

    return budget_groups(waiting, pixels_of, max_pixels)


def _react(
    zoomed: Zoomed,
    query: Query,
    generation: Generation,
    conversation: Conversation,
    small: VisionLanguageModel,
    limits: AgentSettings,
    last: bool,
    seconds: float,
) -> bool:
    """What one turn leads to: True if the job zooms on (its crop is in the conversation),
    False once it has an answer or is deferred."""
    step = AgentStep(
        index=len(zoomed.steps),
        text=generation.text,
        finish_reason=generation.finish_reason,
        new_tokens=generation.new_tokens,
        prompt_tokens=generation.prompt_tokens,
        generate_seconds=seconds,
    )
    zoomed.steps.append(step)
    answer = parse_answer(generation.text)
    if answer is not None:
        problem = answer_problem(answer)
        if problem is not None:  # (the agent's rule: empty, or the loop's tags in it)
            return _defer(zoomed, DeferReason.ZOOM_INVALID, f"turn {step.index + 1}: {problem}")
        zoomed.speculation = Speculation(answer, None, answer_scores(generation))
        step.observation = "answered"
        return False
    if last and "<tool_call>" in generation.text:
        return _defer(zoomed, DeferReason.DEPTH_EXHAUSTED, f"no answer after {step.index} zoom(s)")
    started = time.perf_counter()
    try:
        call = parse_tool_call(generation.text)
        if last:  # (the turn after the last zoom must answer)
            raise ToolError("no closed <answer> in the last turn")
        step.tool_call = call
        box = [float(value) for value in call["arguments"]["bbox_2d"]]
        step.box_model = box
        crop_box = map_box(box, query.image.size, small.resize_rule, small.protocol, limits)
        crop = small.resize_rule.apply(query.image, crop_box)
    except (ToolError, TrajectoryError, ImageError) as exc:
        step.tool_seconds = time.perf_counter() - started
        return _defer(zoomed, DeferReason.ZOOM_INVALID, f"zoom {step.index + 1}: {exc}")
    except Exception as exc:  # (model text this loop did not foresee: its job alone)
        step.tool_seconds = time.perf_counter() - started
        reason = f"zoom {step.index + 1}: {type(exc).__name__}: {str(exc)[:200]}"
        return _defer(zoomed, DeferReason.ZOOM_INVALID, reason)
    step.box_original = list(crop_box)
    step.tool_seconds = time.perf_counter() - started
    step.observation = f"zoomed into {crop_box}, shown at {crop.width}x{crop.height}"
    conversation.add_generation(generation.text)
    conversation.messages.append(small.protocol.tool_response(crop))
    return True


def _defer(zoomed: Zoomed, reason: DeferReason, detail: str) -> bool:
    zoomed.defer, zoomed.detail = reason, detail
    zoomed.steps[-1].observation = f"deferred: {detail}"
    return False
