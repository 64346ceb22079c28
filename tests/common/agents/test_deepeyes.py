"""The DeepEyes loop on the scripted backend: boxes, crops, errors and the step limit,
under both protocols (``v0``: ours; ``reference``: the SpecEyes evaluation's loop)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from PIL import Image, ImageDraw

from common.agents.deepeyes import parse_answer, run_deepeyes
from common.backends.base import Generation
from common.backends.scripted import JobScript, ScriptedModel
from common.chat import Conversation
from common.config import AgentSettings
from common.contracts import Query
from common.errors import StopRequested
from common.images import ResizeRule
from common.protocols import REFERENCE, V0, Protocol
from common.protocols import reference as reference_text

INSTRUCTION_SUFFIX = V0.agent_suffix
SYSTEM_PROMPT = V0.agent_system

# The tiny Qwen2.5-VL's processor: a 448x336 original is seen at 252x168.
RULE = ResizeRule(factor=28, min_pixels=3136, max_pixels=50176)


class RecordingModel(ScriptedModel):
    """Scripted, and keeps every conversation it was shown."""

    def __init__(self, steps: Sequence[str], protocol: Protocol = V0) -> None:
        rule = RULE if protocol.image_grid is None else protocol.image_grid
        script = {"job": JobScript(agent_steps=tuple(steps))}
        super().__init__(script, resize_rule=rule, protocol=protocol)
        self.seen: list[list] = []
        self.roles: list[list[str]] = []
        self.stops: list[tuple[str, ...]] = []

    def generate(self, conversation: Conversation, **kwargs) -> Generation:
        self.seen.append([list(m.content) for m in conversation.messages])
        self.roles.append([m.role for m in conversation.messages])
        self.stops.append(tuple(kwargs["stop"]))
        return super().generate(conversation, **kwargs)


def zoom(box: list[float], label: str = "thing") -> str:
    call = {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": box, "label": label}}
    return f"<think>look closer</think><tool_call>{json.dumps(call)}</tool_call>"


def original() -> Image.Image:
    image = Image.new("RGB", (448, 336), (0, 0, 255))
    ImageDraw.Draw(image).rectangle((112, 84, 335, 251), fill=(255, 0, 0))
    return image


def run(steps: Sequence[str], protocol: Protocol = V0, image=None, **limits) -> tuple:
    model = RecordingModel(steps, protocol)
    query = Query("job", image or original(), "What colour is the box?", ("red", "blue"))
    return run_deepeyes(query, model, AgentSettings(**limits)), model


def test_a_zoom_crops_the_original_at_the_mapped_box():
    trajectory, model = run([zoom([63, 42, 189, 126]), "<think>red</think><answer>A</answer>"])
    assert trajectory.answer == "A" and trajectory.error_code is None
    first = trajectory.steps[0]
    assert first.box_model == [63, 42, 189, 126]
    # x scale 448 / 252, y scale 336 / 168
    assert first.box_original == [112, 84, 336, 252]
    # The crop went back as a user turn: <tool_response> crop suffix </tool_response>
    turn = model.seen[1][-1]
    assert turn[0] == "<tool_response>" and turn[-1] == "</tool_response>"
    assert turn[2] == INSTRUCTION_SUFFIX
    crop = turn[1]
    expected = RULE.apply(original().crop((112, 84, 336, 252)))
    assert crop.size == expected.size and crop.tobytes() == expected.tobytes()
    assert crop.getpixel((crop.width // 2, crop.height // 2)) == (255, 0, 0)


def test_the_first_turn_follows_the_protocol():
    _, model = run(["<answer>A</answer>"])
    system, user = model.seen[0]
    assert system == [SYSTEM_PROMPT]
    assert "image_zoom_in_tool" in SYSTEM_PROMPT and "<tools>" in SYSTEM_PROMPT
    assert isinstance(user[0], Image.Image)
    assert user[1].endswith(INSTRUCTION_SUFFIX) and "A. red\nB. blue" in user[1]


def test_every_zoom_crops_the_original_never_an_earlier_crop():
    trajectory, model = run([zoom([63, 42, 189, 126]), zoom([0, 0, 126, 84]), "<answer>B</answer>"])
    assert trajectory.steps[1].box_original == [0, 0, 224, 168]
    crop = model.seen[2][-1][1]
    assert crop.tobytes() == RULE.apply(original().crop((0, 0, 224, 168))).tobytes()


def test_a_box_outside_the_image_is_clamped():
    trajectory, _ = run([zoom([200, 100, 400, 300]), "<answer>A</answer>"])
    assert trajectory.steps[0].box_original == [355, 200, 448, 336]


def call(name: str, arguments: str) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


BAD_STEPS = {
    "bad-json": (call("image_zoom_in_tool", "{"), "not valid JSON"),
    "unknown-tool": (call("crop", '{"bbox_2d": [1, 2, 3, 4]}'), "unknown tool"),
    "short-box": (call("image_zoom_in_tool", '{"bbox_2d": [1, 2]}'), "four numbers"),
    "not-object": ('<tool_call>["image_zoom_in_tool"]</tool_call>', "JSON object"),
    "unclosed": ('<tool_call>{"name": "image_zoom_in_tool"', "not closed"),
    "no-format": ("<think>I will just think</think>", "no <tool_call> and no <answer>"),
    "tiny-box": (zoom([10, 10, 20, 100]), "each side must be larger than 30"),  # 18 px wide
    "flat-box": (zoom([0, 0, 250, 0.1]), "each side"),
}


@pytest.mark.parametrize(("text", "message"), BAD_STEPS.values(), ids=BAD_STEPS.keys())
def test_a_bad_step_sends_an_error_and_counts(text: str, message: str):
    trajectory, model = run([text, "<answer>A</answer>"])
    first = trajectory.steps[0]
    assert first.observation.startswith("Error:") and message in first.observation
    assert first.box_original is None
    assert model.seen[1][-1] == [
        "<tool_response>",
        first.observation,
        INSTRUCTION_SUFFIX,
        "</tool_response>",
    ]
    assert trajectory.answer == "A" and len(trajectory.steps) == 2


def test_an_extreme_aspect_ratio_is_refused():
    trajectory, _ = run([zoom([0, 0, 250, 0.1])], max_steps=1, min_box_side=0)
    assert "aspect ratio" in trajectory.steps[0].observation


def test_the_step_limit_ends_as_an_error_not_a_guess():
    trajectory, model = run([zoom([63, 42, 189, 126])], max_steps=3)
    assert trajectory.answer is None
    assert trajectory.error_code == "step_limit"
    assert len(trajectory.steps) == 3 and len(model.seen) == 3


def test_an_answer_after_a_tool_call_is_not_taken():
    assert parse_answer('<tool_call>{"x": 1}</tool_call><answer>A</answer>') is None
    assert parse_answer("<think>x</think> <answer> red </answer>") == "red"
    assert parse_answer("<answer>unfinished") is None


# -- the reference protocol: the SpecEyes evaluation's loop ------------------------------
def odd_original() -> Image.Image:
    """450x340: the reference grid shows it at 448x336 (scales 450/448 and 340/336)."""
    image = Image.new("RGB", (450, 340), (0, 0, 255))
    ImageDraw.Draw(image).rectangle((112, 84, 335, 251), fill=(255, 0, 0))
    return image


def run_reference(steps: Sequence[str], **limits) -> tuple:
    return run(steps, REFERENCE, odd_original(), **limits)


def test_reference_first_turn_stops_and_image_grid():
    _, model = run_reference(["<answer>A</answer>"])
    (system, user), roles = model.seen[0], model.roles[0]
    assert roles == ["system", "user"] and system == [reference_text.AGENT_SYSTEM]
    assert user[1] == (
        "Question: What colour is the box?\n        Options: \nA. red\nB. blue\n\n        "
        "\nThink first, call **image_zoom_in_tool** if needed, then answer. Format strictly "
        "as:  <think>...</think>  <tool_call>...</tool_call> (if tools needed)  "
        "<answer>...</answer> "
    )
    assert user[0].size == (448, 336)  # resized to the 28 px grid before the processor
    assert model.stops[0] == ("</tool_call>", "</answer>", "<|im_end|>")


def test_reference_boxes_are_truncated_in_order_and_not_refused_for_size():
    trajectory, model = run_reference(
        [zoom([63.9, 42.9, 189.9, 126.9]), zoom([10, 10, 20, 20]), "<answer>A</answer>"]
    )
    # int(63.9 * 450/448) = 64, int(42.9 * 340/336) = 43, int(190.75) = 190, int(128.41) = 128
    assert trajectory.steps[0].box_original == [64, 43, 190, 128]
    assert trajectory.steps[1].box_original == [10, 10, 20, 20]  # 10 px: kept (v0: refused)
    turn = model.seen[1][-1]
    assert turn[0] == "<tool_response>" and turn[2] == REFERENCE.agent_suffix
    assert (
        turn[1].tobytes()
        == REFERENCE.image_grid.apply(odd_original().crop((64, 43, 190, 128))).tobytes()
    )
    assert trajectory.answer == "A"


def test_reference_an_open_answer_ends_the_trajectory():
    trajectory, _ = run_reference(["<think>red</think> <answer> A. red"])
    assert trajectory.answer == "A. red" and len(trajectory.steps) == 1
    # what the reference scores is its whole output (pred_answer = output_text); the
    # answer people read sits beside it
    assert trajectory.scored == "<think>red</think> <answer> A. red"


def test_a_closed_answer_and_ours_keep_no_scored_text_of_their_own():
    trajectory, _ = run_reference(["<think>red</think> <answer>A. red</answer>"])
    assert trajectory.answer == "A. red" and trajectory.scored is None
    trajectory, _ = run(["<think>red</think> <answer>A. red"])  # v0: no open answers
    assert trajectory.scored is None


def test_an_answer_the_protocol_cannot_read_is_a_failure_with_its_reason():
    """The loop leaking into the answer (an out-of-domain model's tool-call fragments after
    an unclosed <answer>), an empty answer: failures, not answers; the text stays in the
    step."""
    leaked = '<answer> {"name": "image_zoom_in_tool", <tool_call> {"bbox_2d": [1, 2' + " x" * 200
    for text in (leaked, "<answer>  </answer>", "<answer><think>A</think></answer>"):
        trajectory, _ = run_reference([text])
        assert trajectory.answer is None, text
        assert trajectory.error_code == "answer_unreadable", text
        assert trajectory.steps[-1].text == text
    trajectory, _ = run_reference([leaked])
    assert "holds the protocol's '<tool_call>' tag" in trajectory.error


def test_an_open_answer_cut_at_the_token_limit_is_a_failure():
    class CutShort(RecordingModel):
        def generate(self, conversation: Conversation, **kwargs) -> Generation:
            made = super().generate(conversation, **kwargs)
            return Generation(made.text, "length", made.new_tokens)

    model = CutShort(["<think>x</think> <answer> A. red and then the"], REFERENCE)
    query = Query("job", odd_original(), "What colour?", ("red", "blue"))
    trajectory = run_deepeyes(query, model)
    assert trajectory.answer is None and trajectory.error_code == "answer_unreadable"
    assert "cut at the token limit" in trajectory.error


def test_reference_unparsable_json_gets_the_instruction_as_an_assistant_turn():
    trajectory, model = run_reference(
        [call("image_zoom_in_tool", "{"), "<think>x</think> no format", "<answer>B</answer>"]
    )
    assert model.roles[1][-2:] == ["assistant", "assistant"]
    assert model.seen[1][-1] == [REFERENCE.agent_suffix]
    # neither a call nor an answer: the instruction comes back as a user turn
    assert model.roles[2][-1] == "user" and model.seen[2][-1] == [REFERENCE.agent_suffix]
    assert trajectory.answer == "B" and len(trajectory.steps) == 3


REFERENCE_FATAL = {
    "no-bbox": call("image_zoom_in_tool", '{"label": "x"}'),
    "short-box": call("image_zoom_in_tool", '{"bbox_2d": [1, 2]}'),
    "not-object": '<tool_call>["image_zoom_in_tool"]</tool_call>',
    "text-edges": call("image_zoom_in_tool", '{"bbox_2d": ["1", "2", "30", "40"]}'),
    "reversed": zoom([189, 126, 63, 42]),
}


def test_reference_an_empty_box_shows_a_black_crop_and_the_loop_goes_on():
    """A zero-width box (int(100.2 * 450/448) = int(100.6) = 100 both sides): the
    evaluation crops 0 x 141 pixels and shows them at its smart_resize(0, 141) = 28 x 140,
    black."""
    trajectory, model = run_reference([zoom([100.2, 10, 100.2, 150]), "<answer>A</answer>"])
    assert trajectory.error_code is None and trajectory.answer == "A"
    assert trajectory.steps[0].box_original == [100, 10, 100, 151]
    crop = model.seen[1][-1][1]
    assert crop.size == (28, 140) and crop.getextrema() == ((0, 0), (0, 0), (0, 0))


def test_reference_a_sliver_is_shown_as_the_evaluation_resizes_it():
    """A 2000 x 3 crop: the evaluation's smart_resize lifts the short side to 28 and
    refuses no aspect ratio (transformers' would: over 200), so the loop goes on."""
    wide = Image.new("RGB", (2100, 100), (0, 0, 255))  # shown at 2100 x 112
    trajectory, model = run([zoom([0, 0, 2000, 3.4]), "<answer>A</answer>"], REFERENCE, wide)
    assert trajectory.error_code is None and trajectory.answer == "A"
    assert trajectory.steps[0].box_original == [0, 0, 2000, 3]  # int(3.4 * 100/112) = 3
    assert model.seen[1][-1][1].size == (1988, 28)


def test_reference_an_empty_box_too_small_to_enlarge_ends_the_trajectory():
    """0 x 10 pixels: 28 x 28 is under the grid's least pixels, and enlarging it divides
    by zero in the evaluation: the item ends there, and here."""
    trajectory, _ = run_reference([zoom([100, 10, 100, 20]), "<answer>A</answer>"])
    assert trajectory.answer is None and trajectory.error_code == "tool_call_invalid"
    assert "cannot be shown" in (trajectory.error or "")


@pytest.mark.parametrize("text", REFERENCE_FATAL.values(), ids=REFERENCE_FATAL.keys())
def test_reference_a_call_it_cannot_carry_out_ends_the_trajectory(text: str):
    trajectory, model = run_reference([text, "<answer>A</answer>"])
    assert trajectory.answer is None and trajectory.error_code == "tool_call_invalid"
    assert len(trajectory.steps) == 1 and len(model.seen) == 1


def test_reference_does_not_check_the_tool_name():
    trajectory, _ = run_reference([call("crop", '{"bbox_2d": [0, 0, 100, 100]}'), "<answer>A"])
    assert trajectory.steps[0].box_original == [0, 0, 100, 101] and trajectory.answer == "A"


def test_a_trajectory_stopped_between_steps_leaves_with_the_steps_it_took():
    """A cancel raises ``StopRequested`` before the next generation: the zoom already
    taken (its text and crop) goes with it, marked cancelled, never an answer."""

    class CancelledAfterOne(RecordingModel):
        def generate(self, conversation: Conversation, **kwargs) -> Generation:
            if self.seen:
                raise StopRequested("the job was cancelled")
            return super().generate(conversation, **kwargs)

    model = CancelledAfterOne([zoom([63, 42, 189, 126]), "<answer>A</answer>"])
    query = Query("job", original(), "What colour is the box?", ("red", "blue"))
    with pytest.raises(StopRequested) as stopped:
        run_deepeyes(query, model, AgentSettings())
    kept = stopped.value.trajectory
    assert [step.text for step in kept.steps] == [zoom([63, 42, 189, 126])]
    assert kept.steps[0].box_original is not None and kept.answer is None  # (its zoom)
    assert kept.error_code == "cancelled" and "after 1 step" in kept.error


def test_a_box_of_numbers_no_float_holds_ends_the_trajectory_as_an_error():
    """An integer of 400 digits, or an edge that scales past a float's range, is a call
    that cannot be carried out, never an error outside the job."""
    import pytest

    from common.agents.deepeyes import TrajectoryError, _box_of

    with pytest.raises(TrajectoryError, match="OverflowError"):
        _box_of({"arguments": {"bbox_2d": [1, 2, 3, int("9" * 400)]}})
