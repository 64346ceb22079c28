"""What the gate reads and what it returns, as plain values (no torch).

A backend turns a model's output into ``TokenScores`` at its edge; ``common.gate``
computes ``GateResult`` from them. Both travel through contracts, the store and the
calibration replay, which therefore never need torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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
