"""The tau picker: exact binomial tails, the fixed-sequence walk, and its guarantee
checked by simulation on outcomes with a known error curve."""

from __future__ import annotations

import math
import random

import pytest

from common.evaluation.calibration import binomial_cdf, default_grid, pick_tau


def test_the_binomial_tail_is_exact():
    assert binomial_cdf(0, 10, 0.1) == pytest.approx(0.9**10, rel=1e-12)
    assert binomial_cdf(1, 3, 0.5) == pytest.approx(0.5, rel=1e-12)  # (1 + 3) / 8
    assert binomial_cdf(5, 5, 0.3) == 1.0 and binomial_cdf(-1, 5, 0.3) == 0.0
    total = sum(math.comb(2000, i) * 0.02**i * 0.98 ** (2000 - i) for i in range(31))
    assert binomial_cdf(30, 2000, 0.02) == pytest.approx(total, rel=1e-9)


def test_the_walk_stops_at_the_first_tau_it_cannot_certify():
    confidences = [0.99] * 300 + [0.95] * 100 + [0.8] * 100
    wrong = [False] * 300 + [False] * 99 + [True] + [True] * 50 + [False] * 50
    choice = pick_tau(confidences, wrong, [0.999, 0.98, 0.9, 0.7], max_error=0.05, delta=0.05)
    by_tau = {test.tau: test for test in choice.tests}
    assert by_tau[0.999].accepted == 0 and not by_tau[0.999].certified  # passed over
    assert by_tau[0.98].certified and by_tau[0.9].certified  # 0 of 300, 1 of 400 wrong
    assert not by_tau[0.7].certified and by_tau[0.7].wrong == 51
    assert choice.tau == 0.9


def test_no_tau_is_picked_when_none_meets_the_target():
    choice = pick_tau([0.99] * 20, [True] * 5 + [False] * 15, [0.9], max_error=0.02, delta=0.05)
    assert choice.tau is None and choice.certified == []


def true_risk(tau: float, slope: float) -> float:
    """Confidence ~ U(0.5, 1), wrong with probability slope * (1 - c): the error rate of
    answers above tau is slope * (1 - tau) / 2."""
    return slope * (1 - tau) / 2


def test_the_guarantee_holds_in_simulation():
    epsilon, delta, slope, items, trials = 0.02, 0.05, 0.2, 5000, 1000
    rng = random.Random(20261130)
    grid = default_grid()
    violations = picked = 0
    for _ in range(trials):
        confidences = [rng.uniform(0.5, 1.0) for _ in range(items)]
        wrong = [rng.random() < slope * (1 - c) for c in confidences]
        choice = pick_tau(confidences, wrong, grid, max_error=epsilon, delta=delta)
        if choice.tau is not None:
            picked += 1
            violations += true_risk(choice.tau, slope) > epsilon
    assert violations <= delta * trials  # the bound holds in >= 1 - delta of the trials
    # and it is not vacuous: most trials certify a tau (the first testable threshold
    # accepts ~150 items, which must hold no error at all; one wrong there ends the walk)
    assert picked > 0.5 * trials
