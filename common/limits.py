"""What one request may carry, checked once where it enters: the API, ``annotate``'s
manifests and benchmarks, ``ask``.

Two kinds of refusal, both ``InvalidInput``:

- ``OverLimit``: a question, option, id or name longer than its setting, or more options
  than ``max_options`` (the API answers 413 and names the setting);
- anything else malformed (an empty question, one option): 422 at the API, a failed job
  of its own in a corpus.

Text is refused, never silently changed, when PostgreSQL or UTF-8 cannot store it: a NUL
character, or a lone surrogate (JSON's ``"\\ud800"``). A refused corpus row is still
recorded, as a failed job, with ``printable`` versions of its texts (NULs and surrogates
replaced, cut to the limit), so one bad row never stops the others.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from common.config import RequestLimits
from common.errors import InvalidInput

REPLACEMENT = "\ufffd"


class OverLimit(InvalidInput):
    """A value is longer (or more numerous) than its setting allows; ``setting`` names it."""

    code = "over_limit"

    def __init__(self, message: str, *, setting: str) -> None:
        super().__init__(message, code=setting)
        self.setting = setting


def check_text(value: str, field: str) -> str:
    """``value`` if the store can keep it as text; else ``InvalidInput`` naming ``field``."""
    if "\x00" in value:
        raise InvalidInput(f"{field} contains a NUL character", code="invalid_text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(
            f"{field} is not valid Unicode (a lone surrogate such as \\ud800)", code="invalid_text"
        ) from None
    return value


def check_length(value: str, field: str, limit: int, setting: str) -> str:
    check_text(value, field)
    if len(value) > limit:
        raise OverLimit(
            f"{field} has {len(value)} characters; the limit ({setting}) is {limit}",
            setting=setting,
        )
    return value


def check_query(question: str, options: Sequence[str] | None, limits: RequestLimits) -> None:
    """A question and its options as a job may carry them."""
    check_length(question, "the question", limits.max_question_chars, "max_question_chars")
    if not question.strip():
        raise InvalidInput("the question is empty", code="question_empty")
    if options is None:
        return
    if len(options) > limits.max_options:
        raise OverLimit(
            f"{len(options)} options; the limit (max_options) is {limits.max_options}",
            setting="max_options",
        )
    if len(options) < 2:
        raise InvalidInput("multiple choice needs at least 2 options", code="options_too_few")
    for number, option in enumerate(options, 1):
        check_length(option, f"option {number}", limits.max_option_chars, "max_option_chars")


def check_id(value: str, field: str, limits: RequestLimits) -> str:
    """An id, a path or a known answer: storable text within ``max_id_chars``."""
    return check_length(value, field, limits.max_id_chars, "max_id_chars")


def check_name(value: str, limits: RequestLimits) -> str:
    """A batch's name."""
    return check_length(value, "the batch name", limits.max_name_chars, "max_name_chars")


def printable(value: str, limit: int) -> str:
    """``value`` made safe to store beside its failure: NULs and lone surrogates replaced,
    cut to ``limit`` characters (marked with an ellipsis)."""
    cleaned = _UNSTORABLE.sub(REPLACEMENT, value)
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "\u2026"


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # NUL and lone surrogates
