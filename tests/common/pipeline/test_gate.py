"""The gate against values computed by hand from shared/SPEC.md's formula."""

from __future__ import annotations

import math

import pytest
import torch

from common.config import GateSettings
from common.pipeline.gate import confidence, score_answers
from common.scores import TokenScores, score_for

SQRT_2_3 = math.sqrt(2 / 3)


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


# Two answer tokens over a 4-word vocabulary (K = 4 keeps every logit).
# token 1: [5, 3, 2, 1]: competitors 3, 2, 1 -> mu 2, population std sqrt(2/3)
# token 2: [4, 3.5, 3, 2.5]: competitors 3.5, 3, 2.5 -> mu 3, population std sqrt(1/6)
LOGITS = torch.tensor([[1.0, 5.0, 3.0, 2.0], [3.0, 2.5, 4.0, 3.5]])
S1 = (5 - 2) / (SQRT_2_3 + 1e-6)
S2 = (4 - 3) / (math.sqrt(1 / 6) + 1e-6)


def log_max_prob(row: list[float]) -> float:
    return max(row) - math.log(sum(math.exp(v) for v in row))


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("min", sigmoid(0.6 * min(S1, S2))),
        ("mean", sigmoid(0.6 * (S1 + S2) / 2)),
        ("bottom20", sigmoid(0.6 * min(S1, S2))),  # n = 2: max(1, floor(0.4)) = 1 lowest
        (
            "logprob",
            math.exp((log_max_prob([1, 5, 3, 2]) + log_max_prob([3, 2.5, 4, 3.5])) / 2),
        ),
    ],
)
def test_every_mode_matches_hand_computed_value(mode, expected):
    assert confidence(LOGITS, top_k=4, mode=mode) == pytest.approx(expected, rel=1e-12)


def test_bottom20_averages_the_lowest_fifth():
    # Ten tokens [a, 1, 0, -1]: s = a / (sqrt(2/3) + eps); floor(0.2 * 10) = 2 lowest.
    logits = torch.tensor([[float(a), 1.0, 0.0, -1.0] for a in range(10, 0, -1)])
    expected = sigmoid(0.6 * ((1 + 2) / 2) / (SQRT_2_3 + 1e-6))
    assert confidence(logits, top_k=4, mode="bottom20") == pytest.approx(expected, rel=1e-12)


def test_only_the_top_k_logits_count():
    # Far-off logits outside the top 4 must not move the score.
    wide = torch.cat([LOGITS, torch.full((2, 50), -30.0)], dim=1)
    assert confidence(wide, top_k=4) == pytest.approx(confidence(LOGITS, top_k=4), rel=1e-12)


@pytest.mark.parametrize("mode", ["min", "mean", "bottom20", "logprob"])
def test_a_constant_shift_of_a_step_changes_nothing(mode):
    # float64, so the shift itself adds no rounding the score could show
    logits = torch.randn(7, 500, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    shifts = torch.tensor([[5.0], [-100.0], [0.5], [1e3], [-7.0], [2.0], [33.0]]).double()
    assert confidence(logits + shifts, top_k=64, mode=mode) == pytest.approx(
        confidence(logits, top_k=64, mode=mode), rel=1e-9, abs=0
    )


@pytest.mark.parametrize("mode", ["min", "mean", "bottom20", "logprob"])
def test_logprobs_from_a_server_give_the_logits_score(mode):
    logits = torch.randn(5, 1000, generator=torch.Generator().manual_seed(1)) * 4
    # A server returns the top K+1 log-probabilities per token, in its own order,
    # sometimes padded with placeholders.
    top = torch.log_softmax(logits.double(), dim=-1).topk(65).values
    shuffled = [[*reversed(row), -9999.0] for row in top.tolist()]
    from_server = score_answers(
        [TokenScores.from_logprobs(shuffled)], GateSettings(mode=mode, top_k=64, threshold=0.5)
    )[0]
    assert from_server.confidence == pytest.approx(
        confidence(logits, top_k=64, mode=mode), rel=1e-9, abs=0
    )


def test_placeholders_are_left_out_of_the_competitors():
    with_fillers = TokenScores.from_logprobs([[-0.1, -3.0, -4.0, -5.0, -9999.0, float("-inf")]])
    without = TokenScores.from_logprobs([[-0.1, -3.0, -4.0, -5.0]])
    gate = GateSettings(top_k=6, threshold=0.5)
    assert score_answers([with_fillers], gate)[0].confidence == pytest.approx(
        score_answers([without], GateSettings(top_k=4, threshold=0.5))[0].confidence, rel=1e-12
    )


def test_an_empty_answer_is_never_accepted():
    assert confidence(torch.empty(0, 100)) == 0.0
    for mode in ("min", "mean", "bottom20", "logprob"):
        (result,) = score_answers(
            [TokenScores([], [])], GateSettings(mode=mode, top_k=4, threshold=1e-9)
        )
        assert not result.accepted
        assert result.confidence == 0.0


def test_acceptance_is_strictly_above_the_threshold():
    (result,) = score_answers([_answer_with_score(7.0)], GateSettings(threshold=0.5))
    (at_threshold,) = score_answers(
        [_answer_with_score(7.0)], GateSettings(threshold=result.confidence)
    )
    assert not at_threshold.accepted


def test_tau_098_is_a_min_score_of_6_486():
    gate = GateSettings(mode="min", top_k=4, threshold=0.98)
    above, below = score_answers([_answer_with_score(6.49), _answer_with_score(6.48)], gate)
    assert above.accepted and not below.accepted


def test_a_padded_batch_scores_each_answer_as_alone():
    answers = [
        TokenScores([[5, 3, 2, 1]], [0.0]),
        TokenScores([[4, 3.5, 3, 2.5]] * 3, [0.0] * 3),
        TokenScores([], []),
        TokenScores([[9, 1, 0, -1], [2, 1.9, 1.8, 0]], [0.0, 0.0]),
    ]
    gate = GateSettings(mode="bottom20", top_k=4, threshold=0.9)
    together = score_answers(answers, gate)
    alone = [score_answers([answer], gate)[0] for answer in answers]
    assert together == alone


def test_one_token_with_no_competitors_is_never_confident():
    (result,) = score_answers(
        [TokenScores.from_logprobs([[-0.01, -9999.0, -9999.0]])], GateSettings(top_k=3)
    )
    assert result.confidence == 0.0 and not result.accepted


def _answer_with_score(score: float) -> TokenScores:
    """One token [a, 1, 0, -1] whose separability is exactly ``score``."""
    return TokenScores([[score * (SQRT_2_3 + 1e-6), 1.0, 0.0, -1.0]], [0.0])


def test_the_score_is_the_aggregate_before_the_squash_and_score_for_inverts_it():
    for wanted in (0.75, 0.9, 0.98):  # the helper needs S > 1.23
        (result,) = score_answers([_answer_with_score(score_for(wanted))], GateSettings(top_k=4))
        assert result.confidence == pytest.approx(wanted, rel=1e-6)
        assert result.score == pytest.approx(score_for(wanted), rel=1e-6)


def test_one_competitor_is_the_mean_and_a_spread_of_zero():
    """K = 2: one competitor, mu is it and sigma is 0 (divided by K - 1 = 1, not more)."""
    (result,) = score_answers([TokenScores([[5.0, 3.0]], [0.0])], GateSettings(top_k=2))
    assert result.token_scores == [pytest.approx((5.0 - 3.0) / 1e-6, rel=1e-12)]


def test_a_competitor_at_the_placeholder_bound_is_left_out():
    """Values at or below -9000 are a server's fillers: out, at the bound too."""
    at_bound = TokenScores([[-0.1, -3.0, -4.0, -9000.0]], [0.0])
    without = TokenScores([[-0.1, -3.0, -4.0]], [0.0])
    (bounded,) = score_answers([at_bound], GateSettings(top_k=4))
    (three,) = score_answers([without], GateSettings(top_k=3))
    assert bounded.token_scores == pytest.approx(three.token_scores, rel=1e-12)


def test_a_token_without_a_competitor_is_never_confident():
    (result,) = score_answers([TokenScores([[5.0, -9999.0]], [0.0])], GateSettings(top_k=2))
    assert result.token_scores == [float("-inf")] and result.confidence == 0.0


def test_a_one_token_answer_and_the_default_k_of_64():
    """``confidence`` scores an answer of one token (only none is 0.0), over the top 64."""
    row = torch.tensor([[10.0, *[float(-i) for i in range(100)]]])
    top = sorted(row[0].tolist(), reverse=True)[:64]
    mu = sum(top[1:]) / 63
    sigma = math.sqrt(sum((v - mu) ** 2 for v in top[1:]) / 63)
    expected = sigmoid(0.6 * (top[0] - mu) / (sigma + 1e-6))
    assert confidence(row) == pytest.approx(expected, rel=1e-12)


def test_logprob_mode_counts_a_token_whose_last_competitor_is_a_placeholder():
    """The log-probability baseline reads the top value; a filler among the rest does not
    make the token unusable."""
    for values in ([-0.5, -2.0, -9999.0], [-0.5, -9999.0, -9999.0]):  # (the second: none)
        scores = TokenScores([values], [0.0])
        (result,) = score_answers([scores], GateSettings(mode="logprob", top_k=3))
        assert result.confidence == pytest.approx(math.exp(-0.5), rel=1e-12), values


def test_a_batch_of_empty_answers_is_refused_whole():
    empty = [TokenScores([], []), TokenScores([], [])]
    results = score_answers(empty, GateSettings(threshold=1e-9))
    assert [(r.confidence, r.accepted) for r in results] == [(0.0, False), (0.0, False)]


@pytest.mark.parametrize("mode", ["min", "mean", "bottom20"])
def test_a_confident_one_token_answer_is_accepted_in_every_mode(mode):
    """One token (a letter, yes or no: the common answer) is an answer like any other."""
    (result,) = score_answers([_answer_with_score(9.0)], GateSettings(mode=mode, threshold=0.98))
    assert result.accepted and result.score == pytest.approx(9.0, rel=1e-6)
