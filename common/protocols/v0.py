"""The ``v0`` protocol: SpecEyes' own first wording, which the shipped synth models were
trained on (``speceyes models train-synth``). Keep it exactly as it is while any model
trained on it is served; new checkpoints should use ``reference``.

Source: this repository before the reference protocol (``common/prompts.py`` and
``common/agents/deepeyes.py`` at 7505fd2). The DeepEyes tool prompt is Qwen's
function-calling layout around our own description of the zoom tool.
"""

from __future__ import annotations

import json
from typing import Any

SCREEN_SYSTEM = None  # the chat template's default system prompt applies
SCREEN_SUFFIX = (
    "\n\nBefore answering, judge this question about the image: would visual tools (such as "
    "zooming into a region of the image) significantly improve the reliability of your "
    "answer? Reply with only yes or no."
)

SPECULATE_SYSTEM = None
SPECULATE_SUFFIX = "\nAnswer the question about the image. Output only the final answer."
SPECULATE_SUFFIX_WITH_OPTIONS = (
    "\nAnswer the question about the image with the letter of the correct option. "
    "Output only the final answer."
)

# "What is it?\nA. red\nB. blue": the question, then one line per option.
QUESTION_WITH_OPTIONS = "{question}{options}"
QUESTION_WITHOUT_OPTIONS = "{question}"
OPTIONS_PREFIX = ""
OPTION_LINE = "\n{letter}. {option}"

TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "image_zoom_in_tool",
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
AGENT_SYSTEM = (
    "You are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist "
    "with the user query.\n\nYou are provided with function signatures within "
    "<tools></tools> XML tags:\n<tools>\n" + json.dumps(TOOL_SCHEMA) + "\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>"
)
AGENT_SUFFIX = (
    "\nThink first, call **image_zoom_in_tool** if needed, then answer. Format strictly as:  "
    "<think>...</think>  <tool_call>...</tool_call> (if tools needed)  <answer>...</answer> "
)
AGENT_FIRST_TURN = "\n{question}{suffix}"

SCREEN_STOP_STRINGS: tuple[str, ...] = ()
AGENT_STOP_STRINGS = ("</tool_call>", "</answer>")

# DeepEyes' training environment refused these boxes (an error goes back to the model).
MIN_BOX_SIDE = 30
MAX_BOX_ASPECT = 100.0

# -- every field of a Protocol, by name (common.protocols builds it from this module) ----
NAME = "v0"
STRIP_QUESTION = True
FAST_CUT = None  # phases I and II see the whole question
ANSWER_STRIP = True
STOP_KEEPS_TOKEN = False
SCREEN_STRIP = True
SCREEN_STOP = SCREEN_STOP_STRINGS
AGENT_STOP = AGENT_STOP_STRINGS
END_TOKENS = None  # the checkpoint's own end-of-sequence tokens
MALFORMED = "observe"  # every problem goes back to the model as an observation
BOX_RULE = "cover"  # floor / ceil of the sorted edges
IMAGE_GRID = None  # images reach the processor at their own size
