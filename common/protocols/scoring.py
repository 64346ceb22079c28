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
        letters = OPTION_LETTERS.lower()[: len(texts)]
        if want in texts:  # expected given as the option's text
            letter = letters[texts.index(want)]
        elif len(want) == 1 and want in letters:  # expected given as the letter
            letter, want = want, texts[letters.index(want)]
        else:  # an expected answer that is no option: compared as text
            return got == want
        return got in (letter, want) or got.startswith(f"{letter} ")
    if want in ("yes", "no"):
        return got.split(" ", 1)[0] == want if got else False
    return got == want


def standard_answer(benchmark: str, expected: str, options: Sequence[str] | None) -> str:
    """The right answer as the reference writes it: V*'s ``LETTER. TEXT`` (its correct
    option is A), otherwise the expected answer itself (HR-Bench's letter, POPE's word)."""
    if benchmark == "vstar" and options and expected in options:
        return f"{OPTION_LETTERS[list(options).index(expected)]}. {expected}"
    return expected


def reference_verdict(
    benchmark: str, answer: str, expected: str, options: Sequence[str] | None = None
) -> bool | None:
    """The reference evaluation's rule check (MAC-AutoML/SpecEyes ``judge_code/``): True or
    False where its rules decide, None where it asks its LLM judge.

    - every benchmark: an answer in ``\\boxed{...}`` is taken from the box;
    - V* (``judge_vstar.py``): the right option is ``LETTER. TEXT``; a one-character answer
      must be the letter; a two-character one with a dot must contain it; otherwise right
      if the whole ``LETTER. TEXT`` appears in it;
    - HR-Bench (``judge_hr.py``): the same with the letter alone, so any answer that
      *contains* the letter counts (a quirk kept on purpose: "Blue" contains "B");
    - POPE (``judge_pope.py``): an answer as long as the expected word must equal it
      (case counts: "Yes" is wrong for "yes"); any other length goes to the judge.
    """
    if "\\boxed{" in answer:
        answer = answer.split("\\boxed{")[1].split("}")[0]
    if benchmark == "pope":
        return answer == expected if len(answer) == len(expected) else None
    whole = standard_answer(benchmark, expected, options)
    if benchmark == "vstar" and whole != expected:
        letter = whole[0]
    elif benchmark == "hr":
        letter = expected
    else:
        return None
    if len(answer) == 1:
        return answer == letter
    if len(answer) == 2 and "." in answer:
        return letter in answer
    return True if whole in answer else None
