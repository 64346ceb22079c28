"""The funnel's prompts (phases I and II) and how a question with options is shown.

The agent's own prompts live with its loop (``common.agents.deepeyes``).
"""

from __future__ import annotations

from collections.abc import Sequence

OPTION_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

SCREEN_INSTRUCTION = (
    "Before answering, judge this question about the image: would visual tools (such as "
    "zooming into a region of the image) significantly improve the reliability of your "
    "answer? Reply with only yes or no."
)

SPECULATE_INSTRUCTION = "Answer the question about the image. Output only the final answer."

SPECULATE_OPTIONS_INSTRUCTION = (
    "Answer the question about the image with the letter of the correct option. "
    "Output only the final answer."
)


def format_question(question: str, options: Sequence[str] | None) -> str:
    """The question, followed by lettered options ("A. ...") when there are any."""
    if not options:
        return question.strip()
    lines = [question.strip()]
    lines += [f"{OPTION_LETTERS[i]}. {option}" for i, option in enumerate(options)]
    return "\n".join(lines)


def screen_text(question: str, options: Sequence[str] | None) -> str:
    """Phase I: the large model says whether tools would help (yes/no)."""
    return f"{format_question(question, options)}\n\n{SCREEN_INSTRUCTION}"


def speculate_text(question: str, options: Sequence[str] | None) -> str:
    """Phase II: the small model answers directly, tool-free, as briefly as it can."""
    instruction = SPECULATE_OPTIONS_INSTRUCTION if options else SPECULATE_INSTRUCTION
    return f"{format_question(question, options)}\n{instruction}"


def screen_says_tool_free(raw_text: str) -> bool:
    """SPEC's rule: output starting with "no" (case-insensitive, stripped) is tool-free.

    Anything else, malformed or empty output included, means tools are needed.
    """
    return raw_text.strip().lower().startswith("no")
