"""SpecReason (the paper's comparison arm) as the evaluation runs it, with the scripted
backend playing both models: who proposes, what the large model scores, what each call
is shown, when it stops, and what it answers."""

from __future__ import annotations

import pytest
from PIL import Image

from common.agents.specreason import UnreadableScore, run_specreason, score_of
from common.backends.base import Generation
from common.backends.scripted import JobScript, ScriptedModel
from common.chat import Conversation
from common.config import AgentSettings, SandboxSettings
from common.contracts import Query
from common.protocols import REFERENCE, THYME
from common.protocols import specreason as SPECREASON
from tests.helpers.sandbox import bubblewrap_or_skip
from tests.helpers.thyme_steps import CROP

pytestmark = pytest.mark.unit

THINK = "<think>look at the shapes</think>"
ZOOM = (
    '<think>zoom</think> <tool_call>{"name": "image_zoom_in_tool", '
    '"arguments": {"bbox_2d": [10, 10, 60, 60]}}</tool_call>'
)
ANSWER = "<think>seen</think> <answer>B</answer>"


class Recording(ScriptedModel):
    """The scripted model, keeping (purpose, rendered text) of every call."""

    def __init__(self, protocol=REFERENCE, **kwargs) -> None:
        super().__init__(protocol=protocol, **kwargs)
        self.shown: list[tuple[str, str]] = []

    def generate(self, conversation: Conversation, **kwargs) -> Generation:
        text = self.render(conversation.messages, conversation.continue_cut)
        self.shown.append((conversation.purpose, text))
        return super().generate(conversation, **kwargs)


def run(script: JobScript, *, threshold: float = 7.0, limits: AgentSettings | None = None):
    model = Recording(scripts={"job": script})
    image = Image.new("RGB", (300, 200), (10, 200, 30))
    query = Query("job", image, "What colour?", ("red", "green"))
    return run_specreason(query, model, model, limits, threshold=threshold), model


def test_a_step_scored_at_the_threshold_is_kept_one_below_is_written_by_the_large_model():
    script = JobScript(
        proposals=(THINK, "<think>guess</think>", ANSWER), scores=(7, 6, 9), agent_steps=(THINK,)
    )
    trajectory, model = run(script)

    assert trajectory.answer == "B" and trajectory.error is None
    kept, rejected, last = trajectory.steps
    assert (kept.proposer, kept.score, kept.accepted, kept.proposal) == ("small", 7, True, None)
    assert (rejected.proposer, rejected.score, rejected.accepted) == ("large", 6, False)
    assert rejected.proposal == "<think>guess</think>" and rejected.text == THINK
    assert (last.proposer, last.score) == ("small", 9)
    # per round: propose, verify, and a correction only where the score fell short
    purposes = [purpose for purpose, _ in model.shown]
    assert purposes == ["propose", "verify", "propose", "verify", "correct", "propose", "verify"]
    # tokens as the reference counts them: proposals and the correction, not the scores
    # (the scripted model counts a text's words as its tokens: 4, then 1 + 4, then 2)
    assert [s.new_tokens + s.proposal_tokens for s in trajectory.steps] == [4, 5, 2]


def test_each_call_is_shown_the_first_turn_the_kept_steps_in_one_turn_and_the_verify_prompt():
    script = JobScript(proposals=(THINK, ANSWER), scores=(8, 9))
    _, model = run(script)
    first_turn = REFERENCE.agent_start(
        REFERENCE.view(Image.new("RGB", (300, 200))), "What colour?", ("red", "green")
    )
    start = model.render(first_turn, "")  # the system prompt and the user turn, ended
    shown = dict(enumerate(text for _, text in model.shown))
    assert shown[0] == start + "<|im_start|>assistant\n"
    assert shown[1] == (
        f"{start}<|im_start|>assistant\n{THINK}<|im_end|>\n"
        f"<|im_start|>user\n{SPECREASON.VERIFY_PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    )
    # the second round: the kept step is one assistant turn before the proposal's
    assert shown[2] == f"{start}<|im_start|>assistant\n{THINK}<|im_end|>\n<|im_start|>assistant\n"
    assert shown[3].startswith(
        f"{start}<|im_start|>assistant\n{THINK}<|im_end|>\n<|im_start|>assistant\n{ANSWER}"
    )
    # the reference's verify prompt, character for character (its source indentation)
    assert SPECREASON.VERIFY_PROMPT.startswith("\n    Please evaluate the quality of the last")
    assert SPECREASON.VERIFY_PROMPT.endswith("Only output the score as a single digit.\n    ")


def test_a_correction_s_zoom_is_carried_out_but_reaches_neither_model():
    script = JobScript(proposals=(THINK, ANSWER), scores=(2, 9), agent_steps=(ZOOM,))
    trajectory, model = run(script)

    zoomed = trajectory.steps[0]
    assert zoomed.proposer == "large" and zoomed.text == ZOOM
    assert zoomed.box_original is not None and "shown to no model" in zoomed.observation
    # the next round sees the zoom's text, never its crop: one image in every call
    for _, text in model.shown[3:]:
        assert text.count("<image ") == 1 and "<tool_response>" not in text
    assert trajectory.answer == "B"


def test_a_correction_s_call_that_cannot_be_carried_out_ends_the_job_as_the_reference_does():
    bad = '<tool_call>{"name": "image_zoom_in_tool", "arguments": {}}</tool_call>'
    trajectory, _ = run(JobScript(proposals=(THINK,), scores=(0,), agent_steps=(bad,)))
    assert trajectory.answer is None and trajectory.error_code == "tool_call_invalid"
    assert len(trajectory.steps) == 1


def test_deepeyes_stops_only_at_both_answer_tags_and_six_rounds_without_is_an_error():
    unclosed = "<think>so</think> <answer>B"
    trajectory, model = run(JobScript(proposals=(unclosed,), scores=(9,)))
    assert trajectory.answer is None and trajectory.error_code == "step_limit"
    assert len(trajectory.steps) == SPECREASON.ROUNDS == 6
    assert len(model.shown) == 12  # six proposals, six scores: nothing was rejected


def test_deepeyes_answers_what_the_answer_tags_hold_as_the_reference_takes_it():
    held = "<think>x</think> <answer> <think>B </answer>"
    trajectory, _ = run(JobScript(proposals=(held,), scores=(9,)))
    assert trajectory.answer == "<think>B" and trajectory.error is None  # not second-guessed
    assert trajectory.scored is None
    # nothing inside: the evaluation's pred_answer falls back to the whole last step
    empty = "<think>x</think> <answer> </answer>"
    trajectory, _ = run(JobScript(proposals=(empty,), scores=(9,)))
    assert (trajectory.answer, trajectory.scored) == ("", empty)


@pytest.mark.parametrize(
    ("text", "score"),
    [("8", 8), ("Score: 7/9", 7), ("\n 3", 3), ("nine", 0), ("", 0), ("٣", 3)],
)
def test_the_score_is_the_first_digit_and_zero_without_one(text, score):
    assert score_of(text) == score


def test_a_digit_int_cannot_read_ends_the_job_as_the_reference_s_int_raises():
    with pytest.raises(UnreadableScore):
        score_of("²")
    trajectory, _ = run(JobScript(proposals=(THINK,), scores=("²",)))
    assert trajectory.answer is None and trajectory.error_code == "score_unreadable"


@pytest.mark.sandbox
def test_thyme_stops_at_the_word_answer_and_scores_its_whole_last_step():
    bubblewrap_or_skip()
    limits = AgentSettings(
        kind="thyme", max_new_tokens=64, sandbox=SandboxSettings(wall_s=5.0, cpu_s=5)
    )
    prose = "<think>the answer is green</think>"
    script = JobScript(proposals=(THINK, prose), scores=(1, 9), agent_steps=(CROP,))
    model = Recording(protocol=THYME, scripts={"job": script})
    image = Image.new("RGB", (300, 200), (10, 200, 30))
    query = Query("job", image, "What colour?", ("red", "green"))
    trajectory = run_specreason(query, model, model, limits)

    cropped, _ = trajectory.steps
    # the correction's code ran in the sandbox, and its image went to no model
    assert cropped.code is not None and cropped.images
    assert "shown to no model" in cropped.observation
    assert all(text.count("<image ") == 1 for _, text in model.shown)
    assert CROP in model.shown[-1][1] and "<sandbox_output><image" not in model.shown[-1][1]
    assert '### User Image Path:** "/mnt/data/image.jpg"' in model.shown[0][1]
    # "answer" in a thought ends it; the whole step is what the reference scores
    assert trajectory.scored == prose and trajectory.answer == "the answer is green"
