"""SpecReason: step-level speculation, the arm the paper compares SpecEyes with.

Not our method: a baseline run as the SpecEyes evaluation runs it
(``eval_code_deepeyes/SpecReason.py``, ``eval_code_thyme/SpecReason.py``; its strings
are ``common.protocols.specreason``). A job runs alone, with no screen and no gate, for
at most six rounds; each round is one ``AgentStep``:

1. **propose**: the small model is shown the agent's prompts (its system prompt and
   first user turn) and, after the first round, the steps kept so far joined into one
   assistant turn; it writes the next step (the agent's stop strings and token limit);
2. **score**: the large model is shown the same, the proposal as one more assistant
   turn and the verify prompt, and writes at most 10 tokens (DeepEyes' exactly 10, on
   past its end of turn, as there); the first digit in them is the score (0 without
   one);
3. **decide**: a score of at least the threshold keeps the proposal (``proposer``
   "small"); otherwise the large model writes the step itself from the kept steps
   (``proposer`` "large", the proposal kept in the trace beside it).

Tool results never reach either model, a quirk of the evaluation kept on purpose: a
kept proposal's tool call is not carried out; a correction's is (DeepEyes: the zoom's
crop; Thyme: its code, in the sandbox) and recorded in the trace, but the turn it would
add goes into a copy the evaluation throws away. A call DeepEyes cannot carry out ends
the job as an error, as there.

The loop stops once the last kept step holds an answer: DeepEyes' needs both answer
tags, Thyme's only the substring "answer". Six rounds without one end the job as an
error (``step_limit``; the evaluation marks the item an error, and its accuracy leaves
it out). The answer is the evaluation's prediction, not second-guessed (unlike the
agent's, which must be a clean one): DeepEyes', the text inside the first kept step's
answer tags, whatever it holds; Thyme's, the whole last kept step as the evaluation
scores it (``Trajectory.scored``), with the content of its answer tags (else the step
without its tags) as the answer people read.

Tokens are counted as the evaluation counts them: every proposal and every correction,
never the scoring calls (``AgentStep.new_tokens`` + ``proposal_tokens``).
"""

from __future__ import annotations

import json
import re
import time

from common.agents.deepeyes import TrajectoryError, zoom
from common.agents.thyme import execute, image_place, model_grid
from common.agents.thyme import start as thyme_start
from common.agents.trajectory import PROTOCOL_TAG, AgentStep, Trajectory, kept_if_stopped
from common.backends.base import Generation, VisionLanguageModel
from common.chat import Conversation, Message, Purpose
from common.config import AgentSettings
from common.contracts import Query
from common.protocols import specreason as SPECREASON
from common.protocols import thyme as THYME
from common.sandbox import Sandbox, SandboxSession, view_request

_CODE = re.compile(THYME.CODE_BLOCK, re.IGNORECASE)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def run_specreason(
    query: Query,
    large: VisionLanguageModel,
    small: VisionLanguageModel,
    limits: AgentSettings | None = None,
    *,
    threshold: float = SPECREASON.SCORE_THRESHOLD,
    sandbox: Sandbox | None = None,
) -> Trajectory:
    """Run SpecReason on one job to an answer or to a clear error."""
    limits = limits or AgentSettings()
    if limits.kind != "thyme":
        start = large.protocol.agent_start(
            large.protocol.view(query.image), query.question, query.options
        )
        return _Rounds(query, large, small, limits, threshold, start, None).kept_run()
    with (sandbox or Sandbox(limits.sandbox)).session() as session:
        start = thyme_start(query, large.protocol, session)
        return _Rounds(query, large, small, limits, threshold, start, session).kept_run()


class UnreadableScore(Exception):
    """The score's first digit is one ``int`` cannot read: the evaluation's item errs."""


def score_of(text: str) -> int:
    """The verify call's score: its first digit, 0 when it has none."""
    for char in text:
        if char.isdigit():
            try:
                return int(char)
            except ValueError:  # a digit int() cannot read ("²"): the evaluation's int fails
                raise UnreadableScore(f"the score {text!r} has a digit that is no number") from None
    return 0


class _Rounds:
    def __init__(
        self,
        query: Query,
        large: VisionLanguageModel,
        small: VisionLanguageModel,
        limits: AgentSettings,
        threshold: float,
        start: list[Message],
        session: SandboxSession | None,
    ) -> None:
        self.query, self.large, self.small, self.limits = query, large, small, limits
        self.threshold, self.start, self.session = threshold, start, session
        self.kept: list[str] = []
        self.trajectory = Trajectory()
        self.thyme = session is not None

    def kept_run(self) -> Trajectory:
        """``run``; stopped between rounds (a cancel), with the rounds it took."""
        with kept_if_stopped(self.trajectory):
            return self.run()

    def run(self) -> Trajectory:
        for index in range(SPECREASON.ROUNDS):
            step = AgentStep(
                index=index, text="", finish_reason="", new_tokens=0, generate_seconds=0
            )
            self.trajectory.steps.append(step)
            try:
                self._round(step)
            except (TrajectoryError, UnreadableScore) as exc:
                code = (
                    "score_unreadable" if isinstance(exc, UnreadableScore) else "tool_call_invalid"
                )
                self.trajectory.error_code, self.trajectory.error = code, str(exc)
                step.observation = f"ended: {exc}"
                return self.trajectory
            if self._done(self.kept[-1]):
                return self._conclude()
        self.trajectory.error_code = "step_limit"
        self.trajectory.error = f"no answer after {SPECREASON.ROUNDS} rounds"
        return self.trajectory

    def _round(self, step: AgentStep) -> None:
        started = time.perf_counter()
        proposal = self._generate(self.small, "propose", step.index, [])
        verdict = self._generate(
            self.large,
            "verify",
            step.index,
            [Message("assistant", [proposal.text]), Message("user", [SPECREASON.VERIFY_PROMPT])],
            stop=(),
            max_new_tokens=SPECREASON.SCORE_MAX_NEW_TOKENS,
            ignore_eos=(
                SPECREASON.THYME_SCORE_IGNORES_EOS
                if self.thyme
                else SPECREASON.DEEPEYES_SCORE_IGNORES_EOS
            ),
        )
        step.prompt_tokens = proposal.prompt_tokens + verdict.prompt_tokens
        step.score = score_of(verdict.text)
        step.accepted = step.score >= self.threshold
        kept = proposal
        if step.accepted:
            step.proposer = "small"
        else:
            step.proposer, step.proposal = "large", proposal.text
            step.proposal_tokens = proposal.new_tokens
            kept = self._generate(self.large, "correct", step.index, [])
            step.prompt_tokens += kept.prompt_tokens
        step.text, step.finish_reason, step.new_tokens = (
            kept.text,
            kept.finish_reason,
            kept.new_tokens,
        )
        step.generate_seconds = time.perf_counter() - started
        calls = [proposal, verdict] if step.accepted else [proposal, verdict, kept]
        shares = [call.seconds for call in calls if call.seconds is not None]
        step.model_seconds = sum(shares) if len(shares) == len(calls) else None  # (batched)
        if not step.accepted:
            started = time.perf_counter()
            self._carry_out(step)
            step.tool_seconds = time.perf_counter() - started
        self.kept.append(kept.text)

    def _generate(
        self,
        model: VisionLanguageModel,
        purpose: Purpose,
        index: int,
        after: list[Message],
        *,
        stop: tuple[str, ...] | None = None,
        max_new_tokens: int | None = None,
        ignore_eos: bool = False,
    ) -> Generation:
        """One generation after the first turn, the kept steps (one assistant turn) and
        ``after``; a new assistant turn."""
        history = (
            [Message("assistant", [SPECREASON.HISTORY_JOIN.join(self.kept)])] if self.kept else []
        )
        conversation = Conversation(
            messages=[*self.start, *history, *after],
            key=self.query.job_id,
            generations=index,
            purpose=purpose,
        )
        return model.generate(
            conversation,
            stop=self.large.protocol.agent_stop if stop is None else stop,
            max_new_tokens=self.limits.max_new_tokens if max_new_tokens is None else max_new_tokens,
            ignore_eos=ignore_eos,
        )

    def _carry_out(self, step: AgentStep) -> None:
        """A correction's tool call, carried out and recorded, never shown to a model."""
        unseen = " (shown to no model: SpecReason's tool results are dropped)"
        if self.session is not None:
            match = _CODE.search(step.text)
            if match is not None:
                code, image = match.group(1).strip(), image_place(self.query, self.session)[0]
                protocol = self.large.protocol  # (nothing is kept: each may take the whole budget)
                view = view_request(model_grid(protocol), self.limits.sandbox.view_tokens)
                execute(self.session, protocol, step, code, image, view)
                # (the step is kept whatever the code did: only its output is dropped)
                step.observation = step.observation.replace(", step dropped", "") + unseen
            return
        if "<tool_call>" not in step.text:
            return
        payload = step.text.split("<tool_call>")[1].split("</tool_call>")[0].strip()
        try:
            call = json.loads(payload)
        except json.JSONDecodeError:
            step.observation = "the tool call is not JSON" + unseen
            return
        step.tool_call = call if isinstance(call, dict) else {"raw": call}
        zoom(step, call, self.query.image, self.large, self.limits)
        step.observation += unseen

    def _done(self, text: str) -> bool:
        marks = SPECREASON.THYME_DONE if self.thyme else SPECREASON.DEEPEYES_DONE
        return all(mark in text for mark in marks)

    def _conclude(self) -> Trajectory:
        """The prediction as the evaluation takes it, kept as it is (an arm to compare
        with is not second-guessed: tags or nothing inside the answer stay)."""
        if not self.thyme:
            first = next(text for text in self.kept if self._done(text))
            self.trajectory.answer = first.split("<answer>")[1].split("</answer>")[0].strip()
            if not self.trajectory.answer:  # an empty answer: the evaluation scores the step
                self.trajectory.scored = self.kept[-1]
            return self.trajectory
        last = self.kept[-1]
        match = _ANSWER.search(last)
        readable = match.group(1).strip() if match else PROTOCOL_TAG.sub("", last).strip()
        self.trajectory.answer, self.trajectory.scored = readable, last
        return self.trajectory
