"""The ``reference`` protocol: what the SpecEyes evaluation asks DeepEyes and Qwen3-VL.

Every string below is model-facing and copied character for character (trailing spaces
included) from the authors' evaluation code, MAC-AutoML/SpecEyes at commit 90d950f:

- ``eval_code_deepeyes/prompt.py``: ``SYSTEM_PROMPT`` (DeepEyes' tool prompt),
  ``SYSTEM_PROMPT_ANSWER`` (phase II), ``USER_PROMPT`` (the instruction suffix),
  ``PROMPT_TEMPLATES_JTC["reliability_weighted"]`` (phase I);
- ``eval_code_deepeyes/SpecEyes.py``: the question layout of ``init_messages_judge_tc``
  (the template's continuation lines keep the eight spaces of its source indentation),
  the option lines (``"A. " + option + "\\n"`` after a leading newline), the ``"\\nAnswer:"``
  of ``prepare_messages_to_answer`` and the stop strings of ``get_response``;
- ``eval_code_deepeyes/utils.py``: the image grid (28 px, 4·28² to 16384·28² pixels) every
  image is resized to (bicubic) before a processor sees it, and in whose pixels the zoom
  boxes are written.

Do not reformat these strings: a checkpoint answers the text it is shown.
"""

from __future__ import annotations

from common.images import ResizeRule

# Phase I (eval_code_deepeyes/prompt.py, PROMPT_TEMPLATES_JTC["reliability_weighted"]).
SCREEN_SYSTEM = (
    "You decide based on answer reliability.\n"
    "\n"
    'Answer "yes" if using a tool would significantly improve correctness or confidence of '
    "the answer.\n"
    "\n"
    'Answer "no" if tools would add little or no value.\n'
    "\n"
    'Output only "yes" or "no".\n'
)
SCREEN_SUFFIX = "\nWould tools significantly improve answer reliability? yes or no."

# Phase II (prompt.py SYSTEM_PROMPT_ANSWER; SpecEyes.py prepare_messages_to_answer).
SPECULATE_SYSTEM = (
    "You are a helpful assistant. Output only the final answer itself. Do not include "
    "explanations, reasoning, labels, or any extra text."
)
SPECULATE_SUFFIX = "\nAnswer:"

# The question as every phase shows it (SpecEyes.py init_messages_judge_tc).
QUESTION_WITH_OPTIONS = "Question: {question}\n        Options: {options}\n        "
QUESTION_WITHOUT_OPTIONS = "Question: {question}\n        "
OPTIONS_PREFIX = "\n"
OPTION_LINE = "{letter}. {option}\n"

# Phase IV, DeepEyes (prompt.py SYSTEM_PROMPT and USER_PROMPT).
AGENT_SYSTEM = (
    "You are a helpful assistant.\n"
    "\n"
    "# Tools\n"
    "You may call one or more functions to assist with the user query.\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
    '{"type":"function","function":{\n'
    '    "name":"image_zoom_in_tool",\n'
    '    "description":"Zoom in on a specific region of the input image by cropping it '
    'based on a bounding box (bbox) and an optional object label.",\n'
    '    "parameters":{\n'
    '        "type":"object",\n'
    '        "properties":{\n'
    '            "bbox_2d":{"type":"array","items":{"type":"number"},"minItems":4,'
    '"maxItems":4,"description":"The bounding box to zoom in, format: [x1, y1, x2, y2]."},\n'
    '            "label":{"type":"string","description":"Label of the object (optional)."}\n'
    "        },\n"
    '        "required":["bbox_2d"]\n'
    "    }\n"
    "}}\n"
    "</tools>\n"
    "\n"
    "# How to call a tool\n"
    "Return a json object with function name and arguments within <tool_call></tool_call> "
    "XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>\n"
    "\n"
    "**Example**:  \n"
    "<tool_call>  \n"
    '{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [10, 20, 100, 200], '
    '"label": "the apple on the desk"}}  \n'
    "</tool_call>\n"
)
AGENT_SUFFIX = (
    "\nThink first, call **image_zoom_in_tool** if needed, then answer. Format strictly as:  "
    "<think>...</think>  <tool_call>...</tool_call> (if tools needed)  <answer>...</answer> "
)
AGENT_FIRST_TURN = "{question}{suffix}"  # init_messages: question_prompt + USER_PROMPT

# Generation stops of phases I and IV (SpecEyes.py get_response / get_batch_response).
STOP_STRINGS = ("</tool_call>", "</answer>", "<|im_end|>")
# Those calls pass eos_token_id=None: only the stop strings end them, so <|im_end|> ends a
# turn and <|endoftext|> does not (phase II keeps the checkpoint's own end tokens).
END_TOKENS = ("<|im_end|>",)

# utils.py IMAGE_FACTOR, MIN_PIXELS, MAX_PIXELS.
IMAGE_FACTOR = 28
IMAGE_MIN_PIXELS = 4 * 28 * 28
IMAGE_MAX_PIXELS = 16384 * 28 * 28

# -- every field of a Protocol, by name (common.protocols builds it from this module) ----
NAME = "reference"
STRIP_QUESTION = False
FAST_CUT = None  # phases I and II see the whole question
ANSWER_STRIP = False  # SpecEyes.py: pred_answer = output_text
STOP_KEEPS_TOKEN = True  # SpecEyes.py get_response: generate(stop_strings=...), batch_decode
SCREEN_STRIP = False  # SpecEyes.py: output_text.lower().startswith("no"), unstripped
SCREEN_STOP = STOP_STRINGS
SPECULATE_SUFFIX_WITH_OPTIONS = SPECULATE_SUFFIX
AGENT_STOP = STOP_STRINGS
MALFORMED = "reference"  # the evaluation's loop (common/agents/deepeyes.py)
BOX_RULE = "truncate"  # utils.py map_box: int() of the scaled edges, clamped, unsorted
MIN_BOX_SIDE = 0  # the evaluation refuses no box for its size ...
MAX_BOX_ASPECT = float("inf")  # ... or its shape
# SpecEyes.py resizes each image and crop itself, with Pillow, in the mode it was opened in
IMAGE_GRID = ResizeRule(IMAGE_FACTOR, IMAGE_MIN_PIXELS, IMAGE_MAX_PIXELS, in_own_mode=True)
