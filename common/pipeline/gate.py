"""Phase III: the answer-separability gate.

For every generated answer token the small model's raw logits are reduced to their top K
values ``z1 >= z2 >= ... >= zK``. The competitors are ranks 2..K; with ``mu`` their mean
and ``sigma`` their population standard deviation (divide by K-1)::

    s_t = (z1 - mu) / (sigma + 1e-6)

An answer's score S aggregates s_t over its tokens (``min``, ``mean``, ``bottom20``:
the mean of the lowest max(1, floor(0.2 n))), and its confidence is
``sigmoid(0.6 * S)``. The ``logprob`` baseline is ``exp(mean_t log max softmax)`` and is
not squashed. An answer is accepted iff confidence > threshold; an answer with no
tokens never is.

s_t does not change when a constant is added to every logit of a step, so the top K+1
log-probabilities an OpenAI-compatible server returns give the same score as raw logits.
Placeholder values such servers put in for missing entries (-9999, -inf, NaN) are masked.

The batch functions are vectorised over a padded ``[answers, tokens, K]`` tensor and
computed in float64 on the CPU: the inputs are small and the threshold is a hard edge.
What the gate reads and returns (``TokenScores``, ``GateResult``) are plain values in
``common.scores``, so the modules that only carry them (backends, contracts, the store)
never load torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from common.config import GateMode, GateSettings
from common.scores import PLACEHOLDER_BELOW, SQUASH, GateResult, TokenScores, accepts

EPS = 1e-6


def token_separability(top: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """s_t for ``top`` [..., K] sorted descending, ``valid`` [..., K] bool -> [...].

    A token whose top-1 or all competitors are missing scores -inf (never confident).
    """
    competitors = top[..., 1:]
    mask = valid[..., 1:]
    count = mask.sum(-1)
    safe = torch.where(mask, competitors, torch.zeros_like(competitors))
    mu = safe.sum(-1) / count.clamp(min=1)
    deviations = torch.where(mask, competitors - mu.unsqueeze(-1), torch.zeros_like(competitors))
    sigma = (deviations.square().sum(-1) / count.clamp(min=1)).sqrt()
    scores = (top[..., 0] - mu) / (sigma + EPS)
    usable = valid[..., 0] & (count > 0)
    return torch.where(usable, scores, torch.full_like(scores, float("-inf")))


def aggregate(scores: torch.Tensor, token_mask: torch.Tensor, mode: GateMode) -> torch.Tensor:
    """Answer score S from per-token scores [B, T] and the answer-token mask [B, T] -> [B].

    For ``logprob`` the per-token values are log max-probabilities and S is their mean.
    Answers with no tokens get -inf.
    """
    count = token_mask.sum(-1)
    inf = torch.full_like(scores, float("inf"))
    if mode == "min":
        result = torch.where(token_mask, scores, inf).min(-1).values
    elif mode in ("mean", "logprob"):
        result = torch.where(token_mask, scores, torch.zeros_like(scores)).sum(-1)
        result = result / count.clamp(min=1)
    elif mode == "bottom20":
        ascending = torch.where(token_mask, scores, inf).sort(-1).values
        lowest = (count * 0.2).floor().clamp(min=1).long()
        keep = torch.arange(scores.shape[-1]).unsqueeze(0) < lowest.unsqueeze(-1)
        kept = torch.where(keep, ascending, torch.zeros_like(ascending)).sum(-1)
        result = kept / lowest
    else:
        raise ValueError(f"unknown gate mode {mode!r}")
    return torch.where(count > 0, result, torch.full_like(result, float("-inf")))


def confidence_batch(
    top: torch.Tensor,
    valid: torch.Tensor,
    token_mask: torch.Tensor,
    log_normalizer: torch.Tensor,
    mode: GateMode,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Confidence per answer, its aggregate score S, and the score per token.

    Shapes: ``top``/``valid`` [B, T, K] (sorted descending), ``token_mask`` [B, T],
    ``log_normalizer`` [B, T]. Returns (confidence [B], S [B], token_scores [B, T]).
    """
    if mode == "logprob":
        per_token = torch.where(valid[..., 0], top[..., 0] - log_normalizer, float("-inf"))
        mean_logprob = aggregate(per_token, token_mask, mode)
        return mean_logprob.exp(), mean_logprob, per_token
    per_token = token_separability(top, valid)
    score = aggregate(per_token, token_mask, mode)
    return torch.sigmoid(SQUASH * score), score, per_token


def _valid_values(values: torch.Tensor) -> torch.Tensor:
    return values.isfinite() & (values > PLACEHOLDER_BELOW)


def confidence(logits: torch.Tensor, *, top_k: int = 64, mode: GateMode = "min") -> float:
    """Confidence of one answer from its raw logits [answer_tokens, vocab]."""
    if logits.ndim != 2:
        raise ValueError(f"logits must be [answer_tokens, vocab], got shape {tuple(logits.shape)}")
    if logits.shape[0] == 0:
        return 0.0
    rows = logits.detach().to("cpu", torch.float64)
    top = rows.topk(min(top_k, rows.shape[-1]), dim=-1).values
    scores = TokenScores(top.tolist(), torch.logsumexp(rows, dim=-1).tolist())
    (result,) = score_answers([scores], GateSettings(mode=mode, top_k=top_k, threshold=0.5))
    return result.confidence


def warm_up(gate: GateSettings) -> None:
    """Gate one made-up answer, so that the first real batch does not pay for importing
    and first running torch (seconds): for processes that start before their work."""
    score_answers([TokenScores([[float(-v) for v in range(gate.top_k)]], [0.0])], gate)


def score_answers(answers: Sequence[TokenScores], gate: GateSettings) -> list[GateResult]:
    """Gate a batch of answers at once; the order of ``answers`` is kept."""
    if not answers:
        return []
    batch, longest, k = len(answers), max(1, max(a.num_tokens for a in answers)), gate.top_k
    top = torch.full((batch, longest, k), float("-inf"), dtype=torch.float64)
    log_norm = torch.zeros((batch, longest), dtype=torch.float64)
    token_mask = torch.zeros((batch, longest), dtype=torch.bool)
    for row, answer in enumerate(answers):
        for t, values in enumerate(answer.top_values):
            kept = sorted(values, reverse=True)[:k]
            top[row, t, : len(kept)] = torch.tensor(kept, dtype=torch.float64)
        log_norm[row, : answer.num_tokens] = torch.tensor(
            answer.log_normalizer, dtype=torch.float64
        )
        token_mask[row, : answer.num_tokens] = True
    conf, score, per_token = confidence_batch(
        top, _valid_values(top), token_mask, log_norm, gate.mode
    )
    return [
        GateResult(
            confidence=float(conf[row]),
            accepted=answer.num_tokens > 0 and accepts(float(conf[row]), gate.threshold),
            token_scores=per_token[row, : answer.num_tokens].tolist(),
            score=float(score[row]),
        )
        for row, answer in enumerate(answers)
    ]
