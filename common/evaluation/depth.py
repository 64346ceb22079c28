"""Speculation in depth, replayed: what a calibration run at depth D says each depth
d <= D would have done, at any gate, without a model.

A calibration run (``annotate --calibrate --speculation-depth D``) speculates every job
at depth 0 and in depth, and runs the agent on every job, keeping each job's times and
tokens. Replaying depth d with scope s at a gate:

- a job reaches the small model at d = 0 when the screen called it tool-free, and at
  d >= 1 also when the scope is 'all';
- there, its answer is the depth-0 answer (d = 0), or the answer it gave after at most d
  zooms (``DepthReplay.answers_at``; one that zoomed more, or never answered, is
  deferred); the gate accepts it or not;
- an accepted job costs the screen and the small model's rounds it ran, and is scored
  by the small answer; any other job costs those plus its own agent run and is scored
  by the agent's answer.

Speedup is the agent's seconds over the funnel's, summed over the jobs (each job's own
measured times: the stages' shares of their batches, its agent run's claim to result).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.config import GateSettings
from common.pipeline.gate import score_answers
from common.scores import TokenScores, accepts, decode

SCOPES = ("tool_free", "all")


@dataclass(frozen=True)
class DepthRow:
    """One depth and scope, replayed over a set of jobs at one gate."""

    depth: int
    scope: str
    jobs: int
    beta: float  # the share of jobs that reach the small model
    alpha: float  # of those, the share whose answer the gate accepts
    accepted: float  # the share of all jobs answered by the small model
    accuracy: float  # the small answer where accepted, the agent's elsewhere
    tokens: float  # per job: the small model's and, where it ran, the agent's
    speedup: float  # the agent alone's seconds over the funnel's

    @property
    def label(self) -> str:
        return f"D={self.depth}" + (" (all)" if self.scope == "all" else "")


@dataclass(frozen=True)
class AgentAlone:
    """The agent on every job, as the same run measured it."""

    jobs: int
    accuracy: float
    tokens: float


def recorded_depth(items: Sequence[Any]) -> int:
    """The deepest depth every item of a calibration run can replay (0: no depth
    records, or not every item has one)."""
    depths = [item.depth.depth if item.depth is not None else 0 for item in items]
    return min(depths, default=0)


def agent_alone(items: Sequence[Any]) -> AgentAlone:
    return AgentAlone(
        len(items),
        sum(_agent_right(item) for item in items) / len(items) if items else 0.0,
        sum(item.agent_tokens for item in items) / len(items) if items else 0.0,
    )


def replay_depths(
    items: Sequence[Any], gate: GateSettings, depth: int, scopes: Sequence[str] = SCOPES
) -> list[DepthRow]:
    """Every depth 0..``depth`` (each ``scopes`` at d >= 1) replayed over ``items``
    (``CalibrationItem``s of a calibration run at depth >= ``depth``) at ``gate``."""
    if not items:
        return []
    if max(depth, 1) > recorded_depth(items):
        raise ValueError(
            f"replaying depth {depth} needs a calibration run at depth >= {max(depth, 1)} "
            "(annotate --calibrate --speculation-depth D)"
        )
    # (what every row reads, found once: each depth-0 answer decoded, each job's agent time)
    answers = [decode(item.replay) if item.replay else None for item in items]
    direct_tokens = [answer.num_tokens if answer else 0 for answer in answers]
    measured = [i.agent_seconds for i in items if i.agent_seconds is not None]
    mean_agent = sum(measured) / len(measured) if measured else 0.0
    agent_seconds = [i.agent_seconds if i.agent_seconds is not None else mean_agent for i in items]
    costs = (direct_tokens, agent_seconds)
    direct = _confidences(answers, gate)
    deep = _confidences([item.depth.scores for item in items], gate)
    rows = [_row(items, 0, "tool_free", direct, gate.threshold, costs)]
    for d in range(1, depth + 1):
        rows += [_row(items, d, scope, deep, gate.threshold, costs) for scope in scopes]
    return rows


def _confidences(answers: list[TokenScores | None], gate: GateSettings) -> list[float | None]:
    """The gate's confidence in each answer (None: no answer, or no token to score)."""
    scored = [(i, answer) for i, answer in enumerate(answers) if answer and answer.num_tokens]
    results = score_answers([answer for _, answer in scored], gate)
    confidences: list[float | None] = [None] * len(answers)
    for (index, _), result in zip(scored, results, strict=True):
        confidences[index] = result.confidence
    return confidences


def _row(
    items: Sequence[Any],
    depth: int,
    scope: str,
    confidences: list[float | None],
    tau: float,
    costs: tuple[list[int], list[float]],
) -> DepthRow:
    """``costs``: per job, its depth-0 answer's tokens and its agent seconds."""
    reached = taken = 0
    right = tokens = agent_s = funnel_s = 0.0
    for item, confidence, direct_tokens, own_agent in zip(items, confidences, *costs, strict=True):
        record = item.depth
        agent_s += own_agent
        seconds = record.screen_seconds
        speculates = item.tool_free or (depth >= 1 and scope == "all")
        accepted = False
        if speculates:
            reached += 1
            if depth == 0:
                seconds += record.speculate_seconds
                tokens += direct_tokens
                small_right = item.right
                answered = confidence is not None
            else:
                seconds += record.seconds_at(depth)
                tokens += record.tokens_at(depth)
                small_right = bool(item.depth_right)
                answered = confidence is not None and record.answers_at(depth)
            accepted = confidence is not None and answered and accepts(confidence, tau)
        if accepted:
            taken += 1
            right += small_right
        else:
            seconds += own_agent
            tokens += item.agent_tokens
            right += _agent_right(item)
        funnel_s += seconds
    jobs = len(items)
    return DepthRow(
        depth,
        scope,
        jobs,
        reached / jobs,
        taken / reached if reached else 0.0,
        taken / jobs,
        right / jobs,
        tokens / jobs,
        agent_s / funnel_s if funnel_s else float("nan"),
    )


def _agent_right(item: Any) -> bool:
    """The agent's answer scored against the label; where a run has none the agent's is
    the reference (right)."""
    return True if item.agent_right is None else bool(item.agent_right)
