"""Phase IV for DeepEyes-style models: think, zoom, look again, answer.

What the model is shown comes from its protocol (``common.protocols``): the tool prompt,
the first user turn (the image and the question, then the instruction suffix), the stop
strings, and the grid the image is resized to. The loop:

1. The model writes ``<think>..</think>`` and then a ``<tool_call>{json}</tool_call>`` or
   an ``<answer>..</answer>``; generation stops at either closing tag.
2. A zoom box is in pixels of the image *as the model saw it*. It is scaled back to the
   original per axis, clamped, cropped from the ORIGINAL image (never an earlier crop),
   resized to the model's grid and returned as a new user turn ``<tool_response>`` crop +
   suffix ``</tool_response>``.
3. Output it cannot use is handled as the protocol says:

   - ``reference`` (the SpecEyes evaluation): an ``<answer>`` ends the trajectory (a
     closing tag is not needed); output with neither a call nor an answer gets the
     instruction suffix back as a user turn; a call whose JSON does not parse gets it
     back as an *assistant* turn (the evaluation does exactly this); a call that parses
     but cannot be carried out (no ``bbox_2d``, not four numbers, an empty box) ends the
     trajectory as an error. Box edges are truncated (``int``) and clamped, not sorted.
   - ``observe`` (``v0``): only a closed ``<answer>`` before any call ends it; every
     other problem (malformed or unknown call, a box refused for its size or shape) goes
     back to the model as an error observation. Edges are floored / ceiled and sorted.

4. The trajectory ends at an answer, or as an error at the step limit: never a guess.
"""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any

from PIL import Image

from common.agents.trajectory import AgentStep, Trajectory, kept_if_stopped
from common.backends.base import VisionLanguageModel
from common.chat import Conversation, Message
from common.config import AgentSettings
from common.contracts import Query
from common.errors import ImageError
from common.images import ResizeRule
from common.protocols import Protocol

__all__ = ["AgentStep", "Trajectory", "run_deepeyes"]

TOOL_NAME = "image_zoom_in_tool"

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class ToolError(Exception):
    """A tool call the loop refuses; its message goes back to the model (``observe``)."""


class TrajectoryError(Exception):
    """A tool call the loop cannot carry out and ends the trajectory on (``reference``)."""


def run_deepeyes(
    query: Query, model: VisionLanguageModel, limits: AgentSettings | None = None
) -> Trajectory:
    """Run one DeepEyes trajectory to an answer or to a clear error."""
    limits = limits or AgentSettings()
    protocol = model.protocol
    conversation = Conversation(key=query.job_id)
    conversation.messages += protocol.agent_start(
        protocol.view(query.image), query.question, query.options
    )
    react = _react_reference if protocol.malformed == "reference" else _react_observe
    trajectory = Trajectory()
    with kept_if_stopped(trajectory):
        for index in range(limits.max_steps):
            started = time.perf_counter()
            generation = model.generate(
                conversation, stop=protocol.agent_stop, max_new_tokens=limits.max_new_tokens
            )
            step = AgentStep(
                index=index,
                text=generation.text,
                finish_reason=generation.finish_reason,
                new_tokens=generation.new_tokens,
                prompt_tokens=generation.prompt_tokens,
                generate_seconds=time.perf_counter() - started,
                model_seconds=generation.seconds,
            )
            trajectory.steps.append(step)
            conversation.add_generation(generation.text)
            started = time.perf_counter()
            try:
                answer, follow_up = react(step, query.image, model, limits)
            except TrajectoryError as exc:
                trajectory.error_code, trajectory.error = "tool_call_invalid", str(exc)
                step.observation = f"ended: {exc}"
                return trajectory
            step.tool_seconds = time.perf_counter() - started
            conversation.messages += follow_up
            if answer is not None:
                closed = "</answer>" in step.text.split("<answer>", 1)[-1]
                as_reference = protocol.malformed == "reference"
                if not closed and as_reference:
                    trajectory.scored = step.text  # the evaluation scores the whole output
                cut = not closed and step.finish_reason == "length"
                trajectory.conclude(answer, cut=cut, as_reference=as_reference)
                return trajectory
    trajectory.error_code = "step_limit"
    trajectory.error = f"no answer after {limits.max_steps} generations"
    return trajectory


Reaction = tuple[str | None, list[Message]]  # (the answer if the trajectory ends, what follows)


def _react_reference(
    step: AgentStep, original: Image.Image, model: VisionLanguageModel, limits: AgentSettings
) -> Reaction:
    """The SpecEyes evaluation's loop (``process_single_large_model``), step by step."""
    protocol, text = model.protocol, step.text
    follow_up: list[Message] = []
    if "<tool_call>" in text:
        payload = text.split("<tool_call>")[1].split("</tool_call>")[0].strip()
        try:
            call = json.loads(payload)
        except json.JSONDecodeError:
            step.observation = "the tool call is not JSON: the instruction goes back"
            follow_up = [Message("assistant", [protocol.agent_suffix])]
        else:
            step.tool_call = call if isinstance(call, dict) else {"raw": call}
            follow_up = [zoom(step, call, original, model, limits)]
    elif "<answer>" not in text:
        step.observation = "no tool call and no answer: the instruction goes back"
        follow_up = [Message("user", [protocol.agent_suffix])]
    return (open_answer(text) if "<answer>" in text else None), follow_up


def _react_observe(
    step: AgentStep, original: Image.Image, model: VisionLanguageModel, limits: AgentSettings
) -> Reaction:
    """Ours (``v0``): a closed answer ends it; every problem goes back as an observation."""
    answer = parse_answer(step.text)
    if answer is not None:
        return answer, []
    try:
        call = parse_tool_call(step.text)
    except ToolError as exc:
        step.observation = f"Error: {exc}"
        return None, [model.protocol.tool_response(step.observation)]
    step.tool_call = call
    return None, [zoom(step, call, original, model, limits)]


def zoom(
    step: AgentStep,
    call: Any,
    original: Image.Image,
    model: VisionLanguageModel,
    limits: AgentSettings,
) -> Message:
    """Carry out a parsed zoom call: the user turn with the crop (or the refusal)."""
    protocol = model.protocol
    try:
        box = _box_of(call)
        step.box_model = [float(value) for value in box]
        crop_box = map_box(step.box_model, original.size, model.resize_rule, protocol, limits)
    except ToolError as exc:
        step.observation = f"Error: {exc}"
        return protocol.tool_response(step.observation)
    step.box_original = list(crop_box)
    try:
        crop = model.resize_rule.apply(original, crop_box)
    except ImageError as exc:  # an empty crop too small to enlarge (the evaluation fails)
        raise TrajectoryError(f"the crop {list(crop_box)} cannot be shown: {exc}") from None
    step.observation = f"zoomed into {crop_box}, shown at {crop.width}x{crop.height}"
    return protocol.tool_response(crop)


def _box_of(call: Any) -> list[Any]:
    """``arguments.bbox_2d`` as four finite numbers, or ``TrajectoryError``: the reference
    ends the trajectory on a call it cannot carry out (a KeyError, TypeError or
    ValueError in its code)."""
    try:
        box = call["arguments"]["bbox_2d"]
        left, top, right, bottom = box
        if not all(isinstance(edge, int | float) for edge in (left, top, right, bottom)):
            raise TypeError(f"bbox_2d must hold numbers, not {box!r}")
        values = [float(left), float(top), float(right), float(bottom)]
    except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:
        raise TrajectoryError(
            f"the tool call cannot be carried out ({type(exc).__name__}: {exc})"
        ) from None
    if not all(math.isfinite(value) for value in values):
        raise TrajectoryError("the tool call's bbox_2d has a value that is not finite")
    return list(box)


def parse_answer(text: str) -> str | None:
    """The text of the first complete ``<answer>`` that comes before any tool call."""
    answer = _ANSWER.search(text)
    if answer is None:
        return None
    call = text.find("<tool_call>")
    if call != -1 and call < answer.start():
        return None
    return answer.group(1).strip()


def parse_tool_call(text: str) -> dict[str, Any]:
    """The JSON of the step's tool call, checked against the tool's schema."""
    match = _TOOL_CALL.search(text)
    if match is None:
        if "<tool_call>" in text:
            raise ToolError("the tool call was not closed with </tool_call>")
        raise ToolError("no <tool_call> and no <answer>; call the tool or answer in the format")
    try:
        call = json.loads(match.group(1).strip())
    except json.JSONDecodeError as exc:
        raise ToolError(f"the tool call is not valid JSON ({exc.msg})") from None
    except (ValueError, RecursionError):  # (an integer of 4,300 digits; 1,000 brackets deep)
        raise ToolError("the tool call is not JSON this loop reads") from None
    if not isinstance(call, dict):
        raise ToolError("the tool call must be a JSON object with name and arguments")
    if call.get("name") != TOOL_NAME:
        raise ToolError(f"unknown tool {call.get('name')!r}; the only tool is {TOOL_NAME}")
    arguments = call.get("arguments")
    box = arguments.get("bbox_2d") if isinstance(arguments, dict) else None
    if not (
        isinstance(box, list)
        and len(box) == 4
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in box)
        and all(_finite(v) for v in box)
    ):
        raise ToolError("bbox_2d must be a list of four numbers [x1, y1, x2, y2]")
    return call


def _finite(value: float) -> bool:
    """A number a box may hold: finite as a float (an integer of 309 digits is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def map_box(
    box: list[float],
    original_size: tuple[int, int],
    rule: ResizeRule,
    protocol: Protocol,
    limits: AgentSettings,
) -> tuple[int, int, int, int]:
    """A box in the model's view (``rule`` made it) -> a checked crop box in original pixels.

    ``truncate`` (reference): each edge scaled and truncated with ``int``, then clamped to
    the image, in the order written; ``cover``: the edges sorted, floored / ceiled, clamped.
    Under ``reference``, a reversed box (right before left, or bottom above top) ends the
    trajectory, as the evaluation's crop raises; an empty one (a side of 0) is cropped,
    as there: the model is shown a black image at the grid's least side (28 x N), and the
    loop goes on. Otherwise both are refused like any box under the limits.
    """
    width, height = original_size
    view_width, view_height = rule.size_for(width, height)
    scale_x, scale_y = width / view_width, height / view_height
    # scaled, then held just outside the image as floats: a finite edge may scale past
    # what a float holds, and int() or floor() of that raises; held so, every edge
    # clamps and compares as it would have
    xs = [min(max(value * scale_x, -1.0), width + 1.0) for value in (box[0], box[2])]
    ys = [min(max(value * scale_y, -1.0), height + 1.0) for value in (box[1], box[3])]
    if protocol.box_rule == "truncate":
        left, top = max(int(xs[0]), 0), max(int(ys[0]), 0)
        right, bottom = min(int(xs[1]), width), min(int(ys[1]), height)
    else:
        x1, x2 = sorted(xs)
        y1, y2 = sorted(ys)
        left, top = min(max(0, math.floor(x1)), width), min(max(0, math.floor(y1)), height)
        right = min(max(0, math.ceil(x2)), width)
        bottom = min(max(0, math.ceil(y2)), height)
    box_width, box_height = right - left, bottom - top
    min_side = protocol.min_box_side if limits.min_box_side is None else limits.min_box_side
    max_aspect = protocol.max_box_aspect if limits.max_box_aspect is None else limits.max_box_aspect
    if protocol.malformed == "reference" and min(box_width, box_height) <= 0:
        if min(box_width, box_height) < 0:  # the evaluation's crop raises: the item ends
            raise TrajectoryError(
                f"the box {[left, top, right, bottom]} is reversed in the original image"
            )
        if min_side <= 0:  # an empty crop, shown black at the grid's least side, as there
            return left, top, right, bottom
    if min(box_width, box_height) <= max(min_side, 0):
        raise ToolError(
            f"the box is {box_width}x{box_height} pixels of the original image; each side "
            f"must be larger than {min_side}"
        )
    if max(box_width, box_height) / min(box_width, box_height) > max_aspect:
        raise ToolError(f"the box's aspect ratio is above {max_aspect:g}")
    return left, top, right, bottom


def open_answer(text: str) -> str:
    """The answer after the first ``<answer>``, up to ``</answer>`` if it was closed.

    (The evaluation scores the whole output when the tag is not closed: under
    ``reference`` that text is kept as the trajectory's ``scored``, and this one is the
    answer people read.)"""
    after = text.split("<answer>", 1)[1]
    return after.split("</answer>", 1)[0].strip()
