"""The reference's LLM judge prompt: what the SpecEyes evaluation asks its judge model
(Qwen2.5-72B there; any OpenAI-compatible endpoint here) about an answer its rules could
not decide. Copied character for character from MAC-AutoML/SpecEyes@90d950f
``judge_code/judge_vstar.py`` (also ``judge_pope.py``) and ``judge_code/judge_hr.py``:
the two differ only in their instruction (a double space and "Judement" in the first).
"""

from __future__ import annotations

SYSTEM = "You are a helpful assistant."

_INSTRUCTION = (
    "\nBelow are two answers to a question. Question is [Question], [Standard Answer] is the "
    "standard answer to the question, and [Model_answer] is the answer extracted from a "
    "model's output to this question.{gap}Determine whether these two answers are "
    "consistent.\nNote that [Model Answer] is consistent with [Standard Answer] whenever "
    "they are essentially the same. If the meaning is expressed in the same way, it is "
    "considered consistent, for example, 'pink' and 'it is pink'.\nIf they are consistent, "
    "{word} is 1; if they are different, {word} is 0. Just output {word} and don't output "
    "anything else.\n\n\n"
)
INSTRUCTION_VSTAR_POPE = _INSTRUCTION.format(gap="  ", word="Judement")  # sic
INSTRUCTION_HR = _INSTRUCTION.format(gap=" ", word="Judgement")

EXAMPLES = (
    "\n[Question]: Is the countertop tan or blue?\n[Standard Answer]: A. The countertop is "
    "tan.\n[Model_answer] : tan\nJudgement: 1\n",
    "\n[Question]: On which side of the picture is the barrier?\n[Standard Answer]: A. The "
    "barrier is on the left side of the picture.\n[Model_answer] : A\nJudgement: 1\n",
    "\n[Question]: Is the kite brown and large?\n[Standard Answer]: A. Yes, the kite is brown "
    "and large.\n[Model_answer] : Yes\nJudgement: 1\n",
    "\n[Question]: Are the spots on a giraffe?\n[Standard Answer]: A. No, the spots are on a "
    "banana.\n[Model_answer] : no\nJudgement: 1\n",
    "\n[Question]: Who is wearing pants?\n[Standard Answer]: A. The boy is wearing pants.\n"
    "[Model_answer] : C. The girl in the picture is wearing pants.\nJudgement: 0\n",
    "\n[Question]: Is the man phone both blue and closed?\n[Standard Answer]: A. Yes, the man "
    "phone is both blue and closed.\n[Model_answer] : No.\nJudgement: 0\n",
    "\n[Question]: What color is the towel in the center of the picture?\n[Standard Answer]: "
    "A. The towel in the center of the picture is blue.\n[Model_answer] : The towel in the "
    "center of the picture is pink.\nJudgement: 0\n",
)

QUERY = (
    "\n[Question]: {question}\n[Standard Answer]: {truth}\n[Model_answer] : {answer}\nJudgement:"
)


def judge_prompt(benchmark: str, question: str, truth: str, answer: str) -> str:
    """The judge's user message: instruction, the seven examples, then this answer."""
    instruction = INSTRUCTION_HR if benchmark == "hr" else INSTRUCTION_VSTAR_POPE
    examples = "".join(example + "\n\n" for example in EXAMPLES)
    return instruction + examples + QUERY.format(question=question, truth=truth, answer=answer)
