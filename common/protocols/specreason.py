"""SpecReason, the step-level speculation the paper compares SpecEyes with, as data.

Copied from the authors' evaluation code, MAC-AutoML/SpecEyes at commit 90d950f,
``eval_code_deepeyes/SpecReason.py`` and ``eval_code_thyme/SpecReason.py`` (the two
agree on everything below unless a name says which agent it is for):

- ``VERIFY_PROMPT``: ``get_utility_score``'s ``verify_prompt``, the user turn the large
  model scores the last step after (its source indentation is part of the string);
- ``SCORE_MAX_NEW_TOKENS``: that call's ``max_new_tokens``; the score is the first digit
  of its decoded text (special tokens skipped), 0 when it has none;
- ``DEEPEYES_SCORE_IGNORES_EOS``: DeepEyes' call passes ``eos_token_id=None``, so it
  writes all ten tokens, on past its end of turn; Thyme's passes the tokenizer's
  ``eos_token_id`` and ends there;
- ``SCORE_THRESHOLD``: ``--score_threshold``'s default (a step scoring at least this is
  kept);
- ``ROUNDS``: ``speculative_reasoning`` stops with an error once ``step_id > 5``;
- the proposals' and corrections' stop strings and token limits are the agent's own
  (``get_response``: DeepEyes 512 tokens, Thyme 2048), so they come from its protocol
  and ``agent.max_new_tokens``.

Do not reformat these strings: a checkpoint answers the text it is shown.
"""

from __future__ import annotations

VERIFY_PROMPT = (
    "\n"
    "    Please evaluate the quality of the last reasoning step. Score from 0-9, where:\n"
    "    9: Perfect logic, directly helps solve the problem\n"
    "    7-8: Good logic, contributes to the solution\n"
    "    5-6: Neutral, doesn't hurt but doesn't help much\n"
    "    3-4: Problematic, may lead to confusion\n"
    "    0-2: Incorrect, misleading, or irrelevant\n"
    "    \n"
    "    Only output the score as a single digit.\n"
    "    "
)
SCORE_MAX_NEW_TOKENS = 10
DEEPEYES_SCORE_IGNORES_EOS = True
THYME_SCORE_IGNORES_EOS = False
SCORE_THRESHOLD = 7.0
ROUNDS = 6
# the kept steps are joined with this into one assistant turn ("\n".join(reasoning_history))
HISTORY_JOIN = "\n"
# when the loop stops: DeepEyes' needs both answer tags in the last kept step; Thyme's
# only the substring "answer" (so "the answer is" in a thought stops it too)
DEEPEYES_DONE = ("<answer>", "</answer>")
THYME_DONE = ("answer",)
