"""What the gate reads and what it returns, as plain values (no torch).

A backend turns a model's output into ``TokenScores`` at its edge; ``common.pipeline.gate``
computes ``GateResult`` from them. Both travel through contracts, the store and the
calibration replay, which therefore never need torch.

What a calibration run keeps to replay any gate later (``encode``, ``decode``): per
speculated job, the top ``REPLAY_K`` logits of every answer token and each token's
log-sum-exp, as float32 (the backend computes them in float32, so nothing is rounded: a
replayed gate decides exactly as the live one did), base64 in a small JSON record:
about 0.5 KB per answer token. (Replaying: ``common.evaluation.calibration.replay``.)
"""

from __future__ import annotations

import base64
import json
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

REPLAY_K = 128  # logits per token a calibration run keeps: any gate with K <= this replays
SQUASH = 0.6  # confidence = sigmoid(SQUASH * S)
PLACEHOLDER_BELOW = -9000.0  # log-probabilities at or below this are servers' fillers


@dataclass(frozen=True)
class TokenScores:
    """What the gate needs of one answer, as plain lists (made once, at a backend's edge).

    ``top_values[t]`` holds token t's largest logits (or log-probabilities), descending,
    at least the K the gate uses. ``log_normalizer[t]`` is the log-sum-exp of token t's
    full row, so ``top_values[t][0] - log_normalizer[t]`` is its log max-probability;
    it is 0.0 when the values already are log-probabilities.
    """

    top_values: list[list[float]]  # [answer_tokens][>= K]
    log_normalizer: list[float]  # [answer_tokens]

    @property
    def num_tokens(self) -> int:
        return len(self.top_values)

    @classmethod
    def from_logprobs(cls, top_logprobs: Sequence[Sequence[float]]) -> TokenScores:
        """Scores from a server's per-token top log-probabilities (any order)."""
        rows = [sorted(row, reverse=True) for row in top_logprobs]
        return cls(top_values=rows, log_normalizer=[0.0] * len(rows))


@dataclass(frozen=True)
class GateResult:
    confidence: float
    accepted: bool
    token_scores: list[float]  # s_t per answer token (log max-prob in logprob mode)
    score: float  # S, the aggregate before the squash (mean log max-prob in logprob mode)


def accepts(confidence: float, threshold: float) -> bool:
    """The gate's decision for an answer with at least one token: confidence > tau."""
    return confidence > threshold


def score_for(confidence: float) -> float:
    """The score S whose squashed confidence is ``confidence`` (the sigmoid's inverse),
    for stand-ins that must produce a chosen confidence."""
    return math.log(confidence / (1 - confidence)) / SQUASH


def encode(scores: TokenScores) -> str:
    """``scores`` as a compact JSON record (every row cut to the same width)."""
    width = min((len(row) for row in scores.top_values), default=0)
    top = array("f", (value for row in scores.top_values for value in row[:width]))
    norm = array("f", scores.log_normalizer)
    return json.dumps(
        {
            "tokens": scores.num_tokens,
            "k": width,
            "top": base64.b64encode(top.tobytes()).decode(),
            "norm": base64.b64encode(norm.tobytes()).decode(),
        }
    )


def decode(record: str) -> TokenScores:
    data = json.loads(record)
    tokens, width = int(data["tokens"]), int(data["k"])
    top, norm = array("f"), array("f")
    top.frombytes(base64.b64decode(data["top"]))
    norm.frombytes(base64.b64decode(data["norm"]))
    rows = [list(top[t * width : (t + 1) * width]) for t in range(tokens)]
    return TokenScores(rows, list(norm))


@dataclass(frozen=True)
class DepthReplay:
    """What a calibration run at speculation depth D keeps of one job's zooms, so that
    any depth d <= D replays without a model: a round's prompt does not depend on D (only
    what a call in the last round means does), so the run's first d + 1 rounds are the
    rounds a run at d would have made.

    ``zooms``: the zooms made before the answer (None: it never answered, deferred or
    its call raised); ``scores``: that answer's rows, ``REPLAY_K`` wide; per round the
    job ran, its share of the round's seconds (generate and crop) and its new tokens;
    its share of the screen's and of the depth-0 speculation's seconds.
    """

    depth: int
    zooms: int | None
    answer: str | None
    scores: TokenScores | None
    round_seconds: list[float]
    round_tokens: list[int]
    screen_seconds: float = 0.0
    speculate_seconds: float = 0.0

    def answers_at(self, depth: int) -> bool:
        """At depth ``depth``, the job reaches an answer (else it is deferred)."""
        return self.zooms is not None and self.zooms <= depth <= self.depth

    def seconds_at(self, depth: int) -> float:
        """Its small model's seconds at depth ``depth`` >= 1 (the rounds it would run)."""
        return sum(self.round_seconds[: depth + 1])

    def tokens_at(self, depth: int) -> int:
        return sum(self.round_tokens[: depth + 1])

    def to_json(self) -> dict[str, Any]:
        return {
            "depth": self.depth,
            "zooms": self.zooms,
            "answer": self.answer,
            "scores": None if self.scores is None else encode(self.scores),
            "round_seconds": self.round_seconds,
            "round_tokens": self.round_tokens,
            "screen_seconds": self.screen_seconds,
            "speculate_seconds": self.speculate_seconds,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DepthReplay:
        scores = data.get("scores")
        return cls(
            depth=int(data["depth"]),
            zooms=None if data.get("zooms") is None else int(data["zooms"]),
            answer=None if data.get("answer") is None else str(data["answer"]),
            scores=decode(scores) if isinstance(scores, str) else None,
            round_seconds=[float(s) for s in data.get("round_seconds") or []],
            round_tokens=[int(t) for t in data.get("round_tokens") or []],
            screen_seconds=float(data.get("screen_seconds") or 0.0),
            speculate_seconds=float(data.get("speculate_seconds") or 0.0),
        )


def wilson(agreed: int, audited: int, z: float) -> tuple[float, float]:
    """The Wilson score interval of a proportion at quantile ``z`` (0, 1 with no trials)."""
    if audited == 0:
        return 0.0, 1.0
    share = agreed / audited
    denominator = 1 + z * z / audited
    centre = (share + z * z / (2 * audited)) / denominator
    spread = z * math.sqrt(share * (1 - share) / audited + z * z / (4 * audited**2)) / denominator
    return max(0.0, centre - spread), min(1.0, centre + spread)
