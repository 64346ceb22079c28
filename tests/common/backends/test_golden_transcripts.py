"""Golden transcripts: the exact text every phase sends under the ``reference`` protocol,
rendered through the real Qwen2.5-VL (agent) and Qwen3-VL (small model) chat templates
of the tiny checkpoints, against texts written out by hand from the SpecEyes evaluation
code (MAC-AutoML/SpecEyes ``eval_code_deepeyes/``: ``prompt.py``, ``SpecEyes.py``,
``utils.py``). A difference of one character here is a different question to the model.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

import pytest
from PIL import Image, ImageDraw

from common.agents.deepeyes import run_deepeyes
from common.backends.base import Generation
from common.backends.transformers_backend import TransformersModel
from common.chat import Conversation
from common.config import AgentSettings
from common.contracts import Failed, Query
from common.images import smart_resize
from common.protocols import REFERENCE, THYME, Protocol
from tests.helpers.models import ForceText
from tests.helpers.sandbox import bubblewrap_or_skip

IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"

CHOICE = Query(
    "mc",
    Image.new("RGB", (640, 480)),
    "What is the color of the umbrella?",
    ("red", "blue", "green", "yellow"),
)
YES_NO = Query("yn", Image.new("RGB", (640, 480)), "Is there a dog in the image?")

# prompt.py PROMPT_TEMPLATES_JTC["reliability_weighted"]["system_prompt"]
SCREEN_SYSTEM = """You decide based on answer reliability.

Answer "yes" if using a tool would significantly improve correctness or confidence of the answer.

Answer "no" if tools would add little or no value.

Output only "yes" or "no".
"""
# SpecEyes.py init_messages_judge_tc: "Question: {question}\n        Options: {options}\n        "
CHOICE_PROMPT = (
    "Question: What is the color of the umbrella?\n"
    "        Options: \nA. red\nB. blue\nC. green\nD. yellow\n"
    "\n        "
)
YES_NO_PROMPT = "Question: Is there a dog in the image?\n        "
# prompt.py USER_PROMPT
SUFFIX = (
    "\nThink first, call **image_zoom_in_tool** if needed, then answer. Format strictly as:  "
    "<think>...</think>  <tool_call>...</tool_call> (if tools needed)  <answer>...</answer> "
)
# prompt.py SYSTEM_PROMPT
AGENT_SYSTEM = """You are a helpful assistant.

# Tools
You may call one or more functions to assist with the user query.
You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type":"function","function":{
    "name":"image_zoom_in_tool",
    "description":"Zoom in on a specific region of the input image by cropping it based on a bounding box (bbox) and an optional object label.",
    "parameters":{
        "type":"object",
        "properties":{
            "bbox_2d":{"type":"array","items":{"type":"number"},"minItems":4,"maxItems":4,"description":"The bounding box to zoom in, format: [x1, y1, x2, y2]."},
            "label":{"type":"string","description":"Label of the object (optional)."}
        },
        "required":["bbox_2d"]
    }
}}
</tools>

# How to call a tool
Return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>

**Example**:  \n<tool_call>  \n{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [10, 20, 100, 200], "label": "the apple on the desk"}}  \n</tool_call>
"""  # noqa: E501 -- the prompt's own lines; the three "  \n" keep its trailing spaces
# SpecReason.py get_utility_score's verify_prompt (both agents'): its source indentation
# is part of it, and "    \n" keeps the blank line's four spaces
VERIFY_PROMPT = """
    Please evaluate the quality of the last reasoning step. Score from 0-9, where:
    9: Perfect logic, directly helps solve the problem
    7-8: Good logic, contributes to the solution
    5-6: Neutral, doesn't hurt but doesn't help much
    3-4: Problematic, may lead to confusion
    0-2: Incorrect, misleading, or irrelevant
    \n    Only output the score as a single digit.
    """


def chat(system: str, user: str) -> str:
    return (
        f"<|im_start|>system\n{system}<|im_end|>\n"
        f"<|im_start|>user\n{IMAGE}{user}<|im_end|>\n<|im_start|>assistant\n"
    )


@dataclass
class Sent:
    """One generation's input: the text the template rendered, and the images in it."""

    text: str
    images: list[Image.Image]


def forced_agent(
    tiny_paths, outputs: list[str] | list[str | list[int]], protocol: Protocol = REFERENCE
) -> tuple[TransformersModel, list[Sent]]:
    """The tiny agent model under ``protocol``, made to write ``outputs`` in turn, and the
    list each of its generations appends what it was sent to."""
    large = TransformersModel(
        str(tiny_paths["large"]), device="cpu", dtype="float32", protocol=protocol
    )
    large.logits_processors = [ForceText(large.tokenizer, outputs, large.eos_ids[0])]
    sent: list[Sent] = []
    real_generate = large.generate

    def spy(conversation: Conversation, **kwargs):
        images = [part for message in conversation.messages for part in message.images]
        sent.append(Sent(large.render(conversation.messages, conversation.continue_cut), images))
        return real_generate(conversation, **kwargs)

    large.generate = spy  # type: ignore[method-assign]
    return large, sent


@pytest.mark.parametrize(("query", "prompt"), [(CHOICE, CHOICE_PROMPT), (YES_NO, YES_NO_PROMPT)])
def test_phase_i_asks_the_agent_model_what_the_evaluation_asks(tiny_large, query, prompt):
    expected = chat(
        SCREEN_SYSTEM,
        prompt + "\nWould tools significantly improve answer reliability? yes or no.",
    )
    assert tiny_large.render(tiny_large.protocol.screen_query(query)) == expected


@pytest.mark.parametrize(("query", "prompt"), [(CHOICE, CHOICE_PROMPT), (YES_NO, YES_NO_PROMPT)])
def test_phase_ii_asks_the_small_model_what_the_evaluation_asks(tiny_small, query, prompt):
    # prompt.py SYSTEM_PROMPT_ANSWER; SpecEyes.py prepare_messages_to_answer ("\nAnswer:")
    system = (
        "You are a helpful assistant. Output only the final answer itself. Do not include "
        "explanations, reasoning, labels, or any extra text."
    )
    sent = tiny_small.render(tiny_small.protocol.speculate_query(query))
    assert sent == chat(system, prompt + "\nAnswer:")


def test_deepeyes_turns_before_and_after_a_zoom(tiny_paths):
    zoom = {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [112, 84, 336, 252]}}
    zoom_text = f"<think>look</think> <tool_call>{json.dumps(zoom)}</tool_call>"
    large, sent = forced_agent(tiny_paths, [zoom_text, "<answer>B</answer>"])
    image = Image.new("RGB", (448, 336), (0, 0, 255))
    ImageDraw.Draw(image).rectangle((112, 84, 335, 251), fill=(255, 0, 0))
    query = Query("q", image, CHOICE.question, CHOICE.options)
    trajectory = run_deepeyes(query, large, AgentSettings())

    assert trajectory.answer == "B"
    first = chat(AGENT_SYSTEM, CHOICE_PROMPT + SUFFIX)
    assert sent[0].text == first
    assert sent[1].text == (
        first
        + f"{zoom_text}<|im_end|>\n"
        + f"<|im_start|>user\n<tool_response>{IMAGE}{SUFFIX}</tool_response><|im_end|>\n"
        + "<|im_start|>assistant\n"
    )
    # utils.py map_box: int() of the scaled edges (448x336 is its own 28 px grid: scale 1)
    assert trajectory.steps[0].box_original == [112, 84, 336, 252]


def _zoomed_once(tiny_paths, image: Image.Image, box: list[int]) -> tuple:
    """A DeepEyes trajectory that zooms on ``box`` then answers: (trajectory, the second
    turn as rendered, the crop the model was shown, its grid through the processor)."""
    zoom = {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": box}}
    zoom_text = f"<think>look</think> <tool_call>{json.dumps(zoom)}</tool_call>"
    large, sent = forced_agent(tiny_paths, [zoom_text, "<answer>B</answer>"])
    trajectory = run_deepeyes(Query("q", image, CHOICE.question, CHOICE.options), large)
    rendered, images = sent[1].text, sent[1].images
    grid = large.processor.image_processor(images=[images[-1]], return_tensors="pt")
    expected_turn = (
        f"{zoom_text}<|im_end|>\n"
        f"<|im_start|>user\n<tool_response>{IMAGE}{SUFFIX}</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert rendered.endswith(expected_turn)
    return trajectory, images[-1], grid["image_grid_thw"].tolist()


def test_a_zero_width_zoom_shows_a_black_28_px_crop_and_goes_on(tiny_paths):
    """utils.py: crop((100, 10, 100, 150)) is 0 x 140; smart_resize(0, 140) = (28, 140)
    (each side at least 28), and the loop goes on with it (a black image)."""
    image = Image.new("RGB", (448, 336), (0, 0, 255))  # its own 28 px grid: scale 1
    trajectory, crop, grid = _zoomed_once(tiny_paths, image, [100, 10, 100, 150])
    assert trajectory.answer == "B" and trajectory.steps[0].box_original == [100, 10, 100, 150]
    assert crop.size == (28, 140) and crop.getextrema() == ((0, 0), (0, 0), (0, 0))
    assert grid == [[1, 10, 2]]  # 140 / 14 rows of 28 / 14 patches


def test_a_10x500_crop_is_shown_at_28x504_as_the_evaluation_resizes_it(tiny_paths):
    """utils.py smart_resize(10, 500) = (28, 504): transformers' rule would give 28x420."""
    image = Image.new("RGB", (448, 560), (0, 0, 255))  # its own 28 px grid: scale 1
    trajectory, crop, grid = _zoomed_once(tiny_paths, image, [100, 20, 110, 520])
    assert trajectory.steps[0].box_original == [100, 20, 110, 520]
    assert crop.size == (28, 504)
    assert grid == [[1, 36, 2]]


def test_an_8k_image_gives_each_model_the_evaluations_visual_tokens():
    """7680x4320 is resized to the 28 px grid within 16384·28² pixels before either
    processor sees it (qwen_vl_utils' fetch_image at patch 14, as the evaluation calls
    it); each processor then fits it to its own patches."""
    view = REFERENCE.image_grid.size_for(7680, 4320)
    assert view == (4760, 2688)  # utils.py smart_resize(7680, 4320)
    # DeepEyes (Qwen2.5-VL: 14 px patches merged 2x2, at most 16384·28² pixels)
    height, width = smart_resize(view[1], view[0], 28, 4 * 28 * 28, 16384 * 28 * 28)
    assert (height // 28) * (width // 28) == 16320
    # Qwen3-VL-2B (16 px patches merged 2x2, 64·32² to 16384·32² pixels)
    height, width = smart_resize(view[1], view[0], 32, 64 * 32 * 32, 16384 * 32 * 32)
    assert (height // 32) * (width // 32) == 12516
    # the original straight into Qwen3-VL's processor would be 16,320 tokens, not 12,516
    height, width = smart_resize(4320, 7680, 32, 64 * 32 * 32, 16384 * 32 * 32)
    assert (height // 32) * (width // 32) == 16320


def test_every_image_reaches_the_processor_on_the_reference_grid(tiny_small):
    seen = tiny_small.protocol.speculate_query(Query("q", Image.new("RGB", (1000, 617)), "Q?"))
    image = seen[-1].images[0]
    assert image.size == REFERENCE.image_grid.size_for(1000, 617) == (1008, 616)


# -- Thyme (eval_code_thyme/: SpecEyes.py build_mc_question_text, utils.py) ---------------
# utils.py SYSTEM_PROMPT
THYME_SYSTEM = """You are a helpful assistant.

Solve the following problem step by step, and optionally write Python code for image manipulation to enhance your reasoning process. The Python code will be executed by an external sandbox, and the processed image or result (wrapped in <sandbox_output></sandbox_output>) can be returned to aid your reasoning and help you arrive at the final answer.

**Reasoning & Image Manipulation (Optional but Encouraged):**
    * You have the capability to write executable Python code to perform image manipulations (e.g., cropping to a Region of Interest (ROI), resizing, rotation, adjusting contrast) or perform calculation for better reasoning.
    * The code will be executed in a secure sandbox, and its output will be provided back to you for further analysis.
    * All Python code snippets **must** be wrapped as follows:
    <code>
    ```python
    # your code.
    ```
    </code>
    * At the end of the code, print the path of the processed image (processed_path) or the result for further processing in a sandbox environment."""  # noqa: E501
THYME_QUESTION = (
    "Question: What is the color of the umbrella?\nOptions:\nA. red\nB. blue\nC. green\n"
    "D. yellow\nPlease select the correct answer from the options above."
)


def test_thyme_phases_i_and_ii_see_the_question_before_its_please(tiny_paths):
    large = TransformersModel(
        str(tiny_paths["large"]), device="cpu", dtype="float32", protocol=THYME
    )
    cut = THYME_QUESTION.split("Please")[0]  # init_messages_judge_tc(question_text.split(...))
    screen = cut + "\nWould tools significantly improve answer reliability? yes or no."
    assert large.render(THYME.screen_query(CHOICE)) == chat(SCREEN_SYSTEM, screen)
    yes_no = "Question: Is there a dog in the image?\n"  # POPE's line, before its "Please"
    assert THYME.speculate_text(YES_NO.question, None) == yes_no + "\nAnswer:"


@pytest.mark.sandbox
def test_thyme_turns_before_and_after_its_code_runs(tiny_paths):
    bubblewrap_or_skip()
    code = (
        "<think>crop</think><code>\n```python\nfrom PIL import Image\n"
        "image = Image.open(image_path)\nx1, y1, x2, y2 = 112, 84, 336, 252\n"
        'processed_path = "/mnt/data/temp_processed_images/crop.png"\n'
        "image.crop((x1, y1, x2, y2)).save(processed_path)\nprint(processed_path)\n```\n</code>"
    )
    _, sent = _thyme_answers_b_after(tiny_paths, code)
    # utils.py generate_prompt_final_qa
    user = (
        f"<image>\n{THYME_QUESTION}\n\n"
        '### User Image Path:** "/mnt/data/image.jpg"\n'
        '### User Image Size:** "448x336"\n\n'
        "### **Output Format (strict adherence required):**\n\n"
        "<think>Your detailed reasoning process, including any code, should go here.</think>\n"
        "<answer>Your final answer to the user's question goes here.</answer>\n"
    )
    first = chat(THYME_SYSTEM, user)
    assert sent[0].text == first
    # run_evaluation: the same assistant turn, continued (no generation prompt, the final
    # "<|im_end|>\n" cut off)
    assert sent[1].text == first + f"{code}<sandbox_output>{IMAGE}</sandbox_output>"


@pytest.mark.sandbox
def test_thyme_printed_text_comes_back_inside_its_sandbox_output(tiny_paths):
    """utils.py run_evaluation: code that saves no image hands back its printed text
    (``first_path``, not a file) between ``<sandbox_output>`` and ``</sandbox_output>``,
    in the same assistant turn."""
    bubblewrap_or_skip()
    code = (
        "<think>measure</think><code>\n```python\nfrom PIL import Image\n"
        "image = Image.open(image_path)\nprint(image.size[0] * 2)\n```\n</code>"
    )
    _, sent = _thyme_answers_b_after(tiny_paths, code)
    assert sent[1].text.endswith(f"{code}<sandbox_output>896</sandbox_output>")


@pytest.mark.sandbox
def test_thyme_after_a_failed_first_execution_the_user_turn_is_continued(tiny_paths):
    """utils.py run_evaluation: code that fails hands back no path, and the loop
    ``continue``s with the failed segment dropped. Every iteration after the first renders
    without a generation prompt and cuts the final ``<|im_end|>\n``: with no assistant
    turn yet, that continues the USER turn (the evaluation's quirk, kept)."""
    bubblewrap_or_skip()
    failing = "<think>try</think><code>\n```python\nprint(1 / 0)\n```\n</code>"
    _, sent = _thyme_answers_b_after(tiny_paths, failing)
    assert len(sent) == 2
    assert sent[1].text == sent[0].text.removesuffix("<|im_end|>\n<|im_start|>assistant\n")
    assert sent[1].text.endswith("goes here.</answer>\n") and "1 / 0" not in sent[1].text


def _hr_query(tmp_path, *, for_thyme: bool = False) -> Query:
    """One HR-Bench row (its TSV layout: base64 image, question, A-D, answer), read by
    our benchmark reader as ``annotate`` reads the file (for a Thyme run: ``for_thyme``)."""
    import base64
    import io

    from common.images import load_image
    from common.sources.benchmarks import read_benchmark

    buffer = io.BytesIO()
    Image.new("RGB", (448, 336), (0, 0, 255)).save(buffer, format="PNG")
    encoded = base64.b64encode(buffer.getvalue()).decode()
    header = "index\tquestion\tanswer\tcategory\tA\tB\tC\tD\timage\n"
    row = f"0\tWhat is the color of the umbrella?\tB\tsingle\tred\tblue\tgreen\tyellow\t{encoded}\n"
    tsv = tmp_path / "hr_bench_4k.tsv"
    tsv.write_text(header + row)
    (read,) = read_benchmark(tsv, tmp_path / "store", for_thyme=for_thyme)
    image, _ = load_image(read.image_path or "")
    options = tuple(read.options or ())
    return Query("hr", image, read.question, options, read.image_path, read.shown_path)


def test_hr_bench_reaches_deepeyes_as_the_evaluation_lays_it_out(tiny_large, tmp_path):
    """SpecEyes.py load_hrbench_data_generator: options "A. " + the A column, ...; then
    init_messages_judge_tc's V*/HR template, the same text as a V* question."""
    query = _hr_query(tmp_path)
    assert query.options == ("red", "blue", "green", "yellow")
    screen = CHOICE_PROMPT + "\nWould tools significantly improve answer reliability? yes or no."
    assert tiny_large.render(tiny_large.protocol.screen_query(query)) == chat(SCREEN_SYSTEM, screen)
    start = tiny_large.protocol.agent_start(query.image, query.question, query.options)
    first = tiny_large.render(start)
    assert first == chat(AGENT_SYSTEM, CHOICE_PROMPT + SUFFIX)


def test_hr_bench_reaches_thyme_as_the_evaluation_lays_it_out(tiny_paths, tmp_path):
    """eval_code_thyme/SpecEyes.py load_hrbench_data_generator: build_mc_question_text
    over the A-D columns (lettered there), the text phases I and II cut at "Please"."""
    large = TransformersModel(
        str(tiny_paths["large"]), device="cpu", dtype="float32", protocol=THYME
    )
    query = _hr_query(tmp_path)
    assert THYME.question_block(query.question, query.options) == THYME_QUESTION
    cut = THYME_QUESTION.split("Please")[0]
    screen = cut + "\nWould tools significantly improve answer reliability? yes or no."
    assert large.render(THYME.screen_query(query)) == chat(SCREEN_SYSTEM, screen)


@pytest.mark.sandbox
def test_thyme_keeps_the_whole_token_that_completed_its_stop_string(tiny_paths):
    """The stop overrun: transformers' stop_strings fire on the token that completes
    "</code>", and the evaluation decodes every generated token, so a last token ">\n"
    leaves "</code>\n" in the turn, and the next prompt reads "</code>\n<sandbox_output>"."""
    bubblewrap_or_skip()
    body = '<think>count</think><code>\n```python\nprint("one, two")\n```\n'
    probe = TransformersModel(str(tiny_paths["large"]), device="cpu", dtype="float32")
    encode = probe.tokenizer.encode
    cut = encode(body + "</code", add_special_tokens=False) + encode(
        ">\n", add_special_tokens=False
    )
    assert probe.tokenizer.decode(cut[-1:]) == ">\n"  # the token that completes "</code>"
    trajectory, sent = _thyme_answers_b_after(tiny_paths, cut)
    assert trajectory.steps[0].text == body + "</code>\n"
    assert sent[1].text.endswith(f"{body}</code>\n<sandbox_output>one, two</sandbox_output>")


@pytest.mark.sandbox
def test_thyme_names_a_benchmark_image_by_the_evaluation_s_own_path(tiny_paths, tmp_path):
    """eval_code_thyme/SpecEyes.py load_hrbench_data_generator: the row's image is
    re-saved as ./eval_code_thyme/_tmp_hr_images/SPLIT/{idx:08d}.jpg and
    generate_prompt_final_qa names that path; the code opens it as written (relative to
    its working folder), and is handed it as image_path."""
    bubblewrap_or_skip()
    path = "./eval_code_thyme/_tmp_hr_images/hr_bench_4k/00000000.jpg"
    code = (
        "<think>size</think><code>\n```python\nfrom PIL import Image\n"
        f'print(Image.open("{path}").size, image_path)\n```\n</code>'
    )
    _, sent = _thyme_answers_b_after(tiny_paths, code, _hr_query(tmp_path, for_thyme=True))
    user = (
        f"<image>\n{THYME_QUESTION}\n\n"
        f'### User Image Path:** "{path}"\n'
        '### User Image Size:** "448x336"\n\n'
    )
    assert user in sent[0].text
    # the code is handed the path as the evaluation hands it (image_path, relative)
    assert sent[1].text.endswith(f"{code}<sandbox_output>(448, 336) {path}</sandbox_output>")


@pytest.mark.sandbox
def test_thyme_hands_a_jpeg_file_to_the_code_as_it_is(tiny_paths, tmp_path):
    """eval_code_thyme/SpecEyes.py: a V* image's own file is the code's image_path and
    the first turn's image: not re-saved (a quality-95 copy of a quality-60 JPEG has
    other pixels)."""
    from common.pipeline.funnel import prepare_query

    bubblewrap_or_skip()
    original = tmp_path / "sa_1234.jpg"
    noisy = Image.effect_noise((448, 336), 60).convert("RGB")
    noisy.save(original, format="JPEG", quality=60)
    query = prepare_query("q", str(original), CHOICE.question, CHOICE.options)
    assert not isinstance(query, Failed)
    code = (
        "<think>check</think><code>\n```python\nimport hashlib\n"
        "print(hashlib.sha256(open(image_path, 'rb').read()).hexdigest())\n```\n</code>"
    )
    _, sent = _thyme_answers_b_after(tiny_paths, code, query)
    digest = hashlib.sha256(original.read_bytes()).hexdigest()
    assert sent[1].text.endswith(f"<sandbox_output>{digest}</sandbox_output>")  # the file
    shown = sent[0].images[0]
    assert shown.tobytes() == Image.open(original).convert("RGB").tobytes()


def test_deepeyes_after_an_unparsable_call_answers_in_a_new_turn(tiny_paths):
    """SpecEyes.py process_messages_to_tc: a call whose JSON does not parse gets the
    instruction back as an assistant turn, and get_response then asks with
    add_generation_prompt=True: a new assistant turn after it, not a continuation."""
    broken = '<think>x</think><tool_call>{"name": "image_zoom_in_tool", {</tool_call>'
    large, sent = forced_agent(tiny_paths, [broken, "<answer>B</answer>"])
    trajectory = run_deepeyes(CHOICE, large, AgentSettings(max_steps=3, max_new_tokens=60))

    assert trajectory.answer == "B", trajectory
    assert sent[1].text == (
        chat(AGENT_SYSTEM, CHOICE_PROMPT + SUFFIX)
        + f"{broken}<|im_end|>\n<|im_start|>assistant\n{SUFFIX}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_specreason_shows_each_model_the_kept_steps_and_asks_a_new_turn(tiny_paths):
    """SpecReason.py: the kept steps joined by "\\n" as one assistant turn, then
    apply_chat_template(add_generation_prompt=True) for the proposal and the correction;
    the verify prompt as the last user turn. Through the real Qwen2.5-VL template."""
    from common.agents.specreason import run_specreason

    first, second = "<think>look</think>", "<think>seen</think> <answer>B</answer>"
    # the one tiny model plays both: proposal, score "8", proposal, score "9"
    model, sent = forced_agent(tiny_paths, [first, "8", second, "9"])
    trajectory = run_specreason(
        CHOICE, model, model, AgentSettings(max_new_tokens=60), threshold=7.0
    )

    assert trajectory.answer == "B", trajectory
    assert [step.score for step in trajectory.steps] == [8, 9]
    start = chat(AGENT_SYSTEM, CHOICE_PROMPT + SUFFIX)
    assert sent[0].text == start
    assert sent[1].text == (
        f"{start}{first}<|im_end|>\n<|im_start|>user\n{VERIFY_PROMPT}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert sent[2].text == f"{start}{first}<|im_end|>\n<|im_start|>assistant\n"
    assert sent[3].text == (
        f"{start}{first}<|im_end|>\n<|im_start|>assistant\n{second}<|im_end|>\n"
        f"<|im_start|>user\n{VERIFY_PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    )


def test_deepeyes_specreason_scores_all_ten_tokens_past_the_end_of_turn(tiny_paths):
    """eval_code_deepeyes/SpecReason.py get_utility_score: generate(max_new_tokens=10,
    eos_token_id=None), decoded with skip_special_tokens=True, the first digit the score.
    A score written after <|im_end|> counts there: "<|im_end|>\\n8" scores 8, so the
    proposal is kept (a call that ends at <|im_end|> reads "" and scores 0)."""
    from common.agents.specreason import run_specreason

    proposal = "<think>seen</think> <answer>B</answer>"
    model, _ = forced_agent(tiny_paths, [proposal, "<|im_end|>\n8", "<answer>C</answer>"])
    seen: list[int] = []
    real_generate = model.generate

    def counted(conversation: Conversation, **kwargs) -> Generation:
        generation = real_generate(conversation, **kwargs)
        seen.append(generation.new_tokens)
        return generation

    model.generate = counted  # type: ignore[method-assign]
    trajectory = run_specreason(
        CHOICE, model, model, AgentSettings(max_new_tokens=60), threshold=7.0
    )

    (step,) = trajectory.steps
    assert (step.score, step.proposer, trajectory.answer) == (8, "small", "B")
    assert seen[1] == 10  # the score call: ten tokens, whatever they are


def reference_prediction(output_text: str) -> str:
    """SpecEyes.py (both agents): the text the evaluation records as the prediction and
    judges, whatever it holds (written out from there)."""
    if "</answer>" in output_text and "<answer>" in output_text:
        return output_text.split("<answer>")[1].split("</answer>")[0].strip()
    return output_text


@pytest.mark.parametrize(
    "written", ["<answer></answer>", "<think>x</think> <answer>B<think>hm</think></answer>"]
)
def test_deepeyes_an_answer_we_fail_keeps_the_text_the_evaluation_scores(tiny_paths, written):
    """An empty answer, or one holding a tag: no answer a reader can take, so the job
    fails here (and waits for a person in the review queue); the evaluation records it as
    its prediction and judges it, so the job keeps that text (``scored``)."""
    large, _ = forced_agent(tiny_paths, [written])
    trajectory = run_deepeyes(CHOICE, large, AgentSettings(max_steps=2, max_new_tokens=60))

    assert trajectory.answer is None and trajectory.error_code == "answer_unreadable"
    assert trajectory.scored == reference_prediction(written)


def test_deepeyes_an_answer_cut_at_the_token_limit_keeps_the_whole_output(tiny_paths):
    written = "<think>x</think> <answer>B is the colour of the umbrella"
    large, _ = forced_agent(tiny_paths, [written])
    trajectory = run_deepeyes(CHOICE, large, AgentSettings(max_steps=2, max_new_tokens=8))

    assert trajectory.answer is None and trajectory.error_code == "answer_unreadable"
    (step,) = trajectory.steps
    assert step.finish_reason == "length" and trajectory.scored == reference_prediction(step.text)


def thyme_prediction(final_assistant_response: str) -> str | None:
    """eval_code_thyme/utils.py run_evaluation: the prediction its agent returns and the
    evaluation judges (written out from there); None where it finds no tag (its status
    "error": the row is left out, as our ``no_answer``)."""
    answer_match = re.search(r"<answer>(.*?)</answer>", final_assistant_response, re.DOTALL)
    return answer_match.group(1).strip() if answer_match else None


@pytest.mark.sandbox
@pytest.mark.parametrize(
    "written", ["<think>x</think><answer> </answer>", "<answer>B<think>hm</think></answer>"]
)
def test_thyme_an_answer_we_fail_keeps_the_text_the_evaluation_scores(tiny_paths, written):
    bubblewrap_or_skip()
    from common.agents.thyme import run_thyme

    large, _ = forced_agent(tiny_paths, [written], THYME)
    image = Image.new("RGB", (448, 336), (0, 0, 255))
    query = Query("q", image, CHOICE.question, CHOICE.options)
    trajectory = run_thyme(query, large, AgentSettings(max_steps=2, max_new_tokens=60))

    assert trajectory.answer is None and trajectory.error_code == "answer_unreadable"
    assert trajectory.scored == thyme_prediction(written) is not None


def _thyme_answers_b_after(tiny_paths, code: str | list[int], query: Query | None = None):
    """Thyme with the model forced to write ``code`` (text or token ids), then answer B;
    by default on a 448 x 336 blue image. The trajectory and what the model was sent at
    each turn."""
    from common.agents.thyme import run_thyme

    large, sent = forced_agent(tiny_paths, [code, "<answer>B</answer>"], THYME)
    if query is None:
        image = Image.new("RGB", (448, 336), (0, 0, 255))
        query = Query("q", image, CHOICE.question, CHOICE.options)
    trajectory = run_thyme(query, large, AgentSettings(max_steps=5, max_new_tokens=200))
    assert trajectory.answer == "B", trajectory
    return trajectory, sent
