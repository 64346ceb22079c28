"""Phase IV for DeepEyes-style models: think, zoom, look again, answer.

The protocol is the one DeepEyes was trained on (shared/SPEC.md §2):

1. The system prompt declares one tool, ``image_zoom_in_tool(bbox_2d, label?)``, in
   Qwen's function-calling layout; the user turn is the image, the question and an
   instruction suffix (think, zoom if needed, answer, in tags).
2. The model writes ``<think>..</think>`` and then a ``<tool_call>{json}</tool_call>`` or
   an ``<answer>..</answer>``; generation stops at either closing tag.
3. A zoom box is in pixels of the image *as the model saw it* (after smart resize). It is
   scaled back to the original per axis, clamped, checked (a side <= 30 px or an aspect
   ratio > 100 is refused), cropped from the ORIGINAL image (never an earlier crop),
   smart-resized and returned as a new user turn ``<tool_response>`` crop + suffix
   ``</tool_response>``. A malformed call, an unknown tool or a refused box sends an error
   observation instead; the step still counts.
4. The trajectory ends at an answer, or as an error at the step limit: never a guess.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from PIL import Image

from common.backends.base import Conversation, VisionLanguageModel
from common.config import AgentLimits
from common.contracts import Query
from common.images import ResizeRule
from common.prompts import format_question

TOOL_NAME = "image_zoom_in_tool"

TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Zoom in on a region of the image by cropping it to a bounding box "
        "(bbox_2d), optionally naming the object in it (label).",
        "parameters": {
            "type": "object",
            "properties": {
                "bbox_2d": {
                    "type": "array",
                    "items": {"type": "number"},
                    "minItems": 4,
                    "maxItems": 4,
                    "description": "The region as [x1, y1, x2, y2]: top-left and "
                    "bottom-right corners, in pixels of the image as you see it.",
                },
                "label": {"type": "string", "description": "The object in the region."},
            },
            "required": ["bbox_2d"],
        },
    },
}

SYSTEM_PROMPT = (
    "You are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist "
    "with the user query.\n\nYou are provided with function signatures within "
    "<tools></tools> XML tags:\n<tools>\n" + json.dumps(TOOL_SCHEMA) + "\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>"
)

INSTRUCTION_SUFFIX = (
    "\nThink first, call **image_zoom_in_tool** if needed, then answer. Format strictly as:  "
    "<think>...</think>  <tool_call>...</tool_call> (if tools needed)  <answer>...</answer> "
)

STOP_STRINGS = ("</tool_call>", "</answer>")

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass
class AgentStep:
    """One generation of the trajectory and what the tool made of it."""

    index: int
    text: str
    finish_reason: str
    new_tokens: int
    generate_seconds: float
    tool_call: dict[str, Any] | None = None
    box_model: list[float] | None = None  # as the model wrote it, in its view's pixels
    box_original: list[int] | None = None  # cropped from the original: [x1, y1, x2, y2]
    observation: str = ""  # what went back to the model, in words
    tool_seconds: float = 0.0


@dataclass
class Trajectory:
    steps: list[AgentStep] = field(default_factory=list)
    answer: str | None = None
    error_code: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ToolError(Exception):
    """A tool call the loop refuses; its message goes back to the model."""


def run_deepeyes(
    query: Query, model: VisionLanguageModel, limits: AgentLimits | None = None
) -> Trajectory:
    """Run one DeepEyes trajectory to an answer or to a clear error."""
    limits = limits or AgentLimits()
    conversation = Conversation(key=query.job_id)
    conversation.add("system", SYSTEM_PROMPT)
    question = format_question(query.question, query.options)
    conversation.add("user", query.image, f"\n{question}{INSTRUCTION_SUFFIX}")
    trajectory = Trajectory()
    for index in range(limits.max_steps):
        started = time.perf_counter()
        generation = model.generate(
            conversation, stop=STOP_STRINGS, max_new_tokens=limits.max_new_tokens
        )
        step = AgentStep(
            index=index,
            text=generation.text,
            finish_reason=generation.finish_reason,
            new_tokens=generation.new_tokens,
            generate_seconds=time.perf_counter() - started,
        )
        trajectory.steps.append(step)
        conversation.add("assistant", generation.text)
        answer = parse_answer(generation.text)
        if answer is not None:
            trajectory.answer = answer
            return trajectory
        started = time.perf_counter()
        conversation.add("user", *_observe(step, query.image, model, limits))
        step.tool_seconds = time.perf_counter() - started
    trajectory.error_code = "step_limit"
    trajectory.error = f"no answer after {limits.max_steps} generations"
    return trajectory


def parse_answer(text: str) -> str | None:
    """The text of the first complete ``<answer>`` that comes before any tool call."""
    answer = _ANSWER.search(text)
    if answer is None:
        return None
    call = text.find("<tool_call>")
    if call != -1 and call < answer.start():
        return None
    return answer.group(1).strip()


def _observe(
    step: AgentStep, original: Image.Image, model: VisionLanguageModel, limits: AgentLimits
) -> list[str | Image.Image]:
    """Carry out the step's tool call; the content of the user turn that answers it."""
    try:
        call = parse_tool_call(step.text)
        step.tool_call = call
        box = call["arguments"]["bbox_2d"]
        step.box_model = [float(value) for value in box]
        crop_box = map_box(step.box_model, original.size, model.resize_rule, limits)
        step.box_original = list(crop_box)
    except ToolError as exc:
        step.observation = f"Error: {exc}"
        return ["<tool_response>", step.observation, INSTRUCTION_SUFFIX, "</tool_response>"]
    crop = model.resize_rule.apply(original.crop(crop_box))
    step.observation = f"zoomed into {crop_box}, shown at {crop.width}x{crop.height}"
    return ["<tool_response>", crop, INSTRUCTION_SUFFIX, "</tool_response>"]


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
        and all(math.isfinite(v) for v in box)
    ):
        raise ToolError("bbox_2d must be a list of four numbers [x1, y1, x2, y2]")
    return call


def map_box(
    box: list[float],
    original_size: tuple[int, int],
    rule: ResizeRule,
    limits: AgentLimits,
) -> tuple[int, int, int, int]:
    """A box in the model's view (``rule`` made it) -> a checked crop box in original pixels."""
    width, height = original_size
    view_width, view_height = rule.size_for(width, height)
    scale_x, scale_y = width / view_width, height / view_height
    x1, x2 = sorted((box[0] * scale_x, box[2] * scale_x))
    y1, y2 = sorted((box[1] * scale_y, box[3] * scale_y))
    left = min(max(0, math.floor(x1)), width)
    top = min(max(0, math.floor(y1)), height)
    right = min(max(0, math.ceil(x2)), width)
    bottom = min(max(0, math.ceil(y2)), height)
    box_width, box_height = right - left, bottom - top
    if min(box_width, box_height) <= limits.min_box_side:
        raise ToolError(
            f"the box is {box_width}x{box_height} pixels of the original image; each side "
            f"must be larger than {limits.min_box_side}"
        )
    if max(box_width, box_height) / min(box_width, box_height) > limits.max_box_aspect:
        raise ToolError(f"the box's aspect ratio is above {limits.max_box_aspect:g}")
    return left, top, right, bottom
