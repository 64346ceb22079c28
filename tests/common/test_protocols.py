"""What each protocol shows a model, as text (the golden transcripts render it through
the real chat templates: tests/common/backends/test_golden_transcripts.py)."""

from __future__ import annotations

import pytest

from common.backends.base import final_answer
from common.errors import ConfigurationError
from common.models.registry import declared_protocol, protocol_name
from common.protocols import REFERENCE, V0, get_protocol, screen_says_tool_free


@pytest.mark.parametrize(
    ("raw", "tool_free"),
    [
        ("no", True),
        ("No.", True),
        ("  NO, the image is clear", True),
        ("yes", False),
        ("Yes, zoom", False),
        ("", False),
        ("I think no", False),  # must START with no
        ("<think>", False),
    ],
)
def test_only_output_starting_with_no_is_tool_free(raw: str, tool_free: bool):
    assert screen_says_tool_free(raw) is tool_free


@pytest.mark.parametrize("raw", ["\nNo", " no", "\tNO."])
def test_the_reference_reads_the_screen_unstripped_as_the_evaluation_does(raw: str):
    """SpecEyes.py: ``output_text.lower().startswith("no")``, nothing stripped: output
    that begins with white space needs tools there (and under ``thyme``); ``v0`` strips."""
    assert REFERENCE.says_tool_free(raw) is False
    assert get_protocol("thyme").says_tool_free(raw) is False
    assert V0.says_tool_free(raw) is True
    assert REFERENCE.says_tool_free("No.") is True


@pytest.mark.parametrize(
    ("raw", "strip", "answer"),
    [
        (" A. red\n", False, " A. red\n"),  # the evaluation scores the output as it came
        (" A. red\n", True, "A. red"),
        ("<think>x</think> <answer> B </answer>", False, "B"),  # tags: stripped either way
    ],
)
def test_a_small_answer_without_tags_is_kept_as_the_protocol_says(raw, strip, answer):
    assert final_answer(raw, strip=strip) == answer
    protocol = V0 if strip else REFERENCE
    assert protocol.answer_strip is strip


def test_v0_letters_the_options_under_the_stripped_question():
    assert V0.question_block("What colour? ", ["red", "blue"]) == "What colour?\nA. red\nB. blue"
    assert "Output only the final answer" in V0.speculate_text("Q?", None)
    assert "letter" in V0.speculate_text("Q?", ["a", "b"])


def test_reference_lays_the_question_out_as_the_evaluation_does():
    # SpecEyes.py init_messages_judge_tc: the template keeps its source indentation
    assert REFERENCE.question_block("What colour?", ["red", "blue"]) == (
        "Question: What colour?\n        Options: \nA. red\nB. blue\n\n        "
    )
    assert REFERENCE.question_block("Is there a dog?", None) == (
        "Question: Is there a dog?\n        "
    )
    assert REFERENCE.speculate_text("Q?", ["a", "b"]).endswith("\n        \nAnswer:")
    assert REFERENCE.screen_text("Q?", None) == (
        "Question: Q?\n        \nWould tools significantly improve answer reliability? yes or no."
    )


def test_a_checkpoint_is_served_with_the_protocol_it_declares(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    assert declared_protocol(str(folder), "small") is None
    assert protocol_name(str(folder), "small", "auto") == "reference"
    (folder / "speceyes.json").write_text('{"protocol": "v0"}')
    assert protocol_name(str(folder), "small", "auto") == "v0"
    assert protocol_name(str(folder), "small", "v0") == "v0"
    with pytest.raises(ConfigurationError, match="trained with the 'v0' protocol"):
        protocol_name(str(folder), "small", "reference")
    assert protocol_name("synth", "large", "auto") == "v0"  # the shipped synth models
    with pytest.raises(ConfigurationError, match="unknown protocol"):
        get_protocol("v9")
