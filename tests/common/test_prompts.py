from __future__ import annotations

import pytest

from common.prompts import format_question, screen_says_tool_free, speculate_text


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


def test_options_are_lettered():
    text = format_question("What colour? ", ["red", "blue"])
    assert text == "What colour?\nA. red\nB. blue"


def test_speculation_asks_for_the_final_answer_only():
    assert "Output only the final answer" in speculate_text("Q?", None)
    assert "letter" in speculate_text("Q?", ["a", "b"])
