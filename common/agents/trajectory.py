"""A trajectory as every agent records it: one ``AgentStep`` per generation."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from common.contracts import Phase, Usage
from common.errors import StopRequested

# The tags of the agents' protocols: an answer holding one is the model's loop leaking
# into its answer (an unclosed tool call, a second turn), not an answer.
PROTOCOL_TAG = re.compile(r"</?(?:tool_call|tool_response|answer|think|code|sandbox_output)>")
UNREADABLE = "answer_unreadable"


@dataclass
class AgentStep:
    """One generation of the trajectory and what the tool made of it."""

    index: int
    text: str
    finish_reason: str
    new_tokens: int
    generate_seconds: float  # from asking to the answer (a batched call's wait included)
    prompt_tokens: int = 0  # what its generations read (0: the backend does not say)
    # its share of the batched calls that ran it (``Generation.seconds``); None: its
    # generations ran alone, and ``generate_seconds`` is their model time
    model_seconds: float | None = None
    tool_call: dict[str, Any] | None = None
    box_model: list[float] | None = None  # as the model wrote it, in its view's pixels
    box_original: list[int] | None = None  # cropped from the original: [x1, y1, x2, y2]
    observation: str = ""  # what went back to the model, in words
    tool_seconds: float = 0.0
    # Thyme: the code the step ran (as written), what it printed, the images it produced
    # (size, digest, a thumbnail), why the sandbox stopped it, if it did, and what the
    # sandbox used (CPU seconds, peak memory of its processes and files)
    code: str | None = None
    code_output: str | None = None
    images: list[dict[str, Any]] | None = None
    sandbox_stop: str | None = None
    sandbox_cpu_s: float | None = None
    sandbox_peak_mb: float | None = None
    # SpecReason (common.agents.specreason): one step per round; who wrote the step kept
    # ("small": its proposal passed; "large": the large model's correction), the large
    # model's score of the proposal, whether it passed, and the rejected proposal
    proposer: str | None = None
    score: int | None = None
    accepted: bool | None = None
    proposal: str | None = None
    proposal_tokens: int = 0  # a rejected proposal's tokens (counted, as the reference does)


@dataclass
class Trajectory:
    steps: list[AgentStep] = field(default_factory=list)
    answer: str | None = None
    error_code: str | None = None
    error: str | None = None
    # the text the reference scores where it differs from ``answer`` (an unclosed
    # <answer>: the whole output; Thyme's SpecReason: the whole last step; a failed
    # answer the evaluation still scores: ``conclude``)
    scored: str | None = None

    def conclude(self, answer: str, *, cut: bool = False, as_reference: bool = False) -> None:
        """End with ``answer``; or, where it is not one a reader can take
        (``answer_problem``), end as a failure saying why. The text stays in the steps
        either way. ``as_reference`` (the ``reference`` and ``thyme`` protocols): a failed
        answer keeps the text the evaluation scores (``scored``: the answer, unless set
        already), as the evaluation records any answer as one and judges it; so the
        reference's accuracy counts the row as it does (``common.store.analytics``)."""
        problem = answer_problem(answer, cut=cut)
        if problem is None:
            self.answer = answer
            return
        self.error_code, self.error = UNREADABLE, problem
        if as_reference and self.scored is None:
            self.scored = answer

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def usage(self) -> Usage:
        """What its steps cost: the generations' seconds (SpecReason's proposals and
        scores too) and tokens, and the tools' seconds (a crop, a sandboxed program)."""
        used = Usage()
        for step in self.steps:
            written = step.new_tokens + step.proposal_tokens
            seconds = step.generate_seconds if step.model_seconds is None else step.model_seconds
            used.add(Phase.AGENT, seconds, step.prompt_tokens, written)
            used.add(Phase.SANDBOX, step.tool_seconds)
            used.turns.append((step.prompt_tokens, written, seconds))
        return used


def answer_problem(answer: str, *, cut: bool = False) -> str | None:
    """Why ``answer`` is not one a reader can take (empty, holding the protocol's tags,
    or ``cut`` off at the token limit before its closing tag); None if it is."""
    tag = PROTOCOL_TAG.search(answer)
    if not answer:
        return "the model's <answer> is empty"
    if tag is not None:
        return (
            f"the model's answer ({len(answer)} characters) holds the protocol's "
            f"{tag.group()!r} tag: its loop leaked into it, so it is no answer"
        )
    if cut:
        return "the model's <answer> was cut at the token limit before it closed"
    return None


@contextmanager
def kept_if_stopped(trajectory: Trajectory) -> Iterator[None]:
    """A trajectory stopped between its steps (its job was cancelled: ``StopRequested``)
    leaves with the steps it took, to be kept with the cancelled job."""
    try:
        yield
    except StopRequested as stop:
        trajectory.error_code = "cancelled"
        trajectory.error = f"stopped after {len(trajectory.steps)} step(s): the job was cancelled"
        stop.trajectory = trajectory
        raise
