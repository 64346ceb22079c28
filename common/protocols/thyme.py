"""The ``thyme`` protocol: what the SpecEyes evaluation asks Thyme and Qwen3-VL.

Every model-facing string below is copied character for character from the authors'
evaluation code, MAC-AutoML/SpecEyes at commit 90d950f:

- ``eval_code_thyme/prompt.py``: phases I and II use the same texts as DeepEyes'
  evaluation (``PROMPT_TEMPLATES_JTC["reliability_weighted"]``, ``SYSTEM_PROMPT_ANSWER``;
  the two ``prompt.py`` files agree on them), imported from ``reference``;
- ``eval_code_thyme/SpecEyes.py``: the question layout (``build_mc_question_text`` and
  the POPE loader's yes/no line), phases I and II shown the text before its first
  ``"Please"`` (``init_messages_judge_tc(question_text.split('Please')[0], ...)``), the
  stop strings of phase I (``get_batch_response``), images of HR-Bench and POPE re-saved
  as RGB JPEG at quality 95 before Thyme sees them;
- ``eval_code_thyme/utils.py``: Thyme's ``SYSTEM_PROMPT``, the first user turn
  (``generate_prompt_final_qa``: the image's path and its size "WxH"), the stop strings
  ``SPECIAL_STRING_LIST``, ``MAX_ITERATIONS`` and ``MAX_NEW_TOKENS_PER_STEP``, the code
  block's pattern, the ``<sandbox_output>`` wrapping, the ``"<|im_end|>\\n"`` cut that
  continues an assistant turn;
- ``eval_code_thyme/sandbox.py``: the code refused before it runs
  (``DANGEROUS_PATTERNS``), the 10 s limit, the output folder the model writes to
  (``/mnt/data/temp_processed_images/``) and the smallest crop side (64).

Do not reformat these strings: a checkpoint answers the text it is shown.
"""

from __future__ import annotations

from common.protocols import reference

# -- phases I and II (same texts as the DeepEyes evaluation) -------------------------------
SCREEN_SYSTEM = reference.SCREEN_SYSTEM
SCREEN_SUFFIX = reference.SCREEN_SUFFIX
SPECULATE_SYSTEM = reference.SPECULATE_SYSTEM
SPECULATE_SUFFIX = reference.SPECULATE_SUFFIX
# phases I and II see the question text up to its first "Please" (its instruction line)
FAST_CUT = "Please"

# -- the question (SpecEyes.py build_mc_question_text; POPE's loader) ----------------------
QUESTION_WITH_OPTIONS = (
    "Question: {question}\nOptions:\n{options}"
    "Please select the correct answer from the options above."
)
QUESTION_WITHOUT_OPTIONS = "Question: {question}\nPlease answer 'yes' or 'no'."
OPTIONS_PREFIX = ""
OPTION_LINE = "{letter}. {option}\n"

# -- phase IV (utils.py) -------------------------------------------------------------------
AGENT_SYSTEM = (
    "You are a helpful assistant.\n"
    "\n"
    "Solve the following problem step by step, and optionally write Python code for image "
    "manipulation to enhance your reasoning process. The Python code will be executed by an "
    "external sandbox, and the processed image or result (wrapped in "
    "<sandbox_output></sandbox_output>) can be returned to aid your reasoning and help you "
    "arrive at the final answer.\n"
    "\n"
    "**Reasoning & Image Manipulation (Optional but Encouraged):**\n"
    "    * You have the capability to write executable Python code to perform image "
    "manipulations (e.g., cropping to a Region of Interest (ROI), resizing, rotation, "
    "adjusting contrast) or perform calculation for better reasoning.\n"
    "    * The code will be executed in a secure sandbox, and its output will be provided "
    "back to you for further analysis.\n"
    "    * All Python code snippets **must** be wrapped as follows:\n"
    "    <code>\n"
    "    ```python\n"
    "    # your code.\n"
    "    ```\n"
    "    </code>\n"
    "    * At the end of the code, print the path of the processed image (processed_path) "
    "or the result for further processing in a sandbox environment."
)
# generate_prompt_final_qa; fields {question}, {path}, {size} ("WxH" of the file)
AGENT_FIRST_TURN = (
    "<image>\n"
    "{question}\n"
    "\n"
    '### User Image Path:** "{path}"\n'
    '### User Image Size:** "{size}"\n'
    "\n"
    "### **Output Format (strict adherence required):**\n"
    "\n"
    "<think>Your detailed reasoning process, including any code, should go here.</think>\n"
    "<answer>Your final answer to the user's question goes here.</answer>\n"
)
AGENT_SUFFIX = ""  # Thyme's user turn has no instruction suffix of DeepEyes' kind
AGENT_STOP = ("</code>", "</answer>")  # SPECIAL_STRING_LIST
MAX_ITERATIONS = 5
MAX_NEW_TOKENS_PER_STEP = 2048
CODE_BLOCK = r"<code>\s*(?:```\s*)?(?:python\s*)?([\s\S]*?)\s*(?:```\s*)?</code>"  # re.I
ANSWER = r"<answer>(.*?)</answer>"  # re.DOTALL, on the whole last assistant turn
SANDBOX_OPEN = "<sandbox_output>"
SANDBOX_CLOSE = "</sandbox_output>"
# run_evaluation renders later iterations without a generation prompt and cuts this end
# off the text, so the model continues the last turn (whichever role wrote it)
CONTINUE_CUT = "<|im_end|>\n"

# -- the sandbox (sandbox.py) --------------------------------------------------------------
EXEC_TIME_LIMIT_S = 10
OUTPUT_DIR = "/mnt/data/temp_processed_images/"  # where the model saves processed images
MIN_CROP_SIDE = 64  # MIN_CROP_DIMENSION: crops are widened to at least this
REFUSED_CODE = (  # DANGEROUS_PATTERNS, searched case-insensitively; a match is not run
    r"\bsys\.",
    r"\bsocket\.",
    r"\bsubprocess\.",
    r"\bexec\(",
    r"\beval\(",
    r"\bcompile\(",
    r"\b__import__\(",
    r"\bos\.(remove|unlink|rmdir)\b",
    r"\bshutil\.rmtree\b",
    r"\bshutil\.move\b",
    r"\bos\.(rename|renames)\b",
)
JPEG_QUALITY = 95  # HR-Bench / POPE images re-saved as RGB JPEG before Thyme sees them
# The path of a benchmark image as the first turn names it and the code opens it
# (SpecEyes.py: load_vstar_data_generator with --vstar_path's default, and the re-saved
# files of the HR-Bench and POPE loaders, {index} their row in the file); relative to
# the code's working folder, where the image is placed
VSTAR_PATH = "data/vstar/{split}/{name}"
HR_PATH = "./eval_code_thyme/_tmp_hr_images/{split}/{index:08d}.jpg"
POPE_PATH = "./eval_code_thyme/_tmp_pope_images/{split}/{index:08d}.jpg"

# phase I (SpecEyes.py get_batch_response, short_answer) and phase IV end at the
# tokenizer's eos token, <|im_end|> for Qwen2.5-VL
ANSWER_STRIP = False  # eval_code_thyme/SpecEyes.py: the same
STOP_KEEPS_TOKEN = True  # eval_code_thyme/SpecEyes.py: the same
SCREEN_STRIP = False  # eval_code_thyme/SpecEyes.py: the same, unstripped
SCREEN_STOP = ("</code>", "</answer>", "<|im_end|>")
END_TOKENS = ("<|im_end|>",)

# -- every field of a Protocol, by name (common.protocols builds it from this module) ----
NAME = "thyme"
STRIP_QUESTION = False
SPECULATE_SUFFIX_WITH_OPTIONS = SPECULATE_SUFFIX
MALFORMED = "reference"  # (the zoom-tool fields below do not apply to Thyme)
BOX_RULE = "truncate"
MIN_BOX_SIDE = 0
MAX_BOX_ASPECT = float("inf")
# qwen_vl_utils' defaults: 28 px, 4·28² to 16384·28². Phases I and II: SpecEyes.py resizes
# the image in its own mode, as DeepEyes' does; the agent's files: Protocol.file_view
IMAGE_GRID = reference.IMAGE_GRID
