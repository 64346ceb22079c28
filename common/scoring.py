"""Rule checks for answers, as the benchmarks' reference scoring does first.

- multiple choice: right if the answer is the correct option's letter ("B", "B.",
  "(B)") or its text;
- yes / no: right if the answer starts with the expected word;
- anything else: right if the normalised texts are equal.

Answers the rules cannot decide (free-form text) would go to an LLM judge in the
reference; here they simply count as wrong.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from common.protocols import OPTION_LETTERS

_PUNCTUATION = re.compile(r"[^\w\s]")


def normalise(text: str) -> str:
    return " ".join(_PUNCTUATION.sub(" ", text.lower()).split())


def is_correct(answer: str | None, expected: str, options: Sequence[str] | None = None) -> bool:
    if answer is None:
        return False
    got, want = normalise(answer), normalise(expected)
    if options:
        texts = [normalise(option) for option in options]
        if want in texts:  # expected given as the option's text
            letter = OPTION_LETTERS[texts.index(want)].lower()
        else:  # expected given as the letter
            letter, want = (
                want,
                texts[OPTION_LETTERS.lower().index(want)] if len(want) == 1 else want,
            )
        return got in (letter, want) or got.startswith(f"{letter} ")
    if want in ("yes", "no"):
        return got.split(" ", 1)[0] == want if got else False
    return got == want
