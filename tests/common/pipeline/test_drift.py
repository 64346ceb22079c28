"""The audit's drift test (``common.pipeline.drift``), simulated: its false-alarm rate
over a whole batch's audits, and how soon it catches a real fall in agreement."""

from __future__ import annotations

import numpy
import pytest

from common.pipeline.drift import drifted, evidence, interval
from common.scores import wilson

LEVEL = 0.01


def first_alarms(agreement: float, baseline: float, batches: int, audits: int, seed: int):
    """Per simulated batch, the audit at which the alarm is first raised (0: never)."""
    draws = numpy.random.default_rng(seed).random((batches, audits)) < agreement
    agreed = numpy.cumsum(draws, axis=1)
    disagreed = numpy.arange(1, audits + 1) - agreed
    raised = evidence(agreed, disagreed, baseline) >= 1 / LEVEL
    return numpy.where(raised.any(axis=1), raised.argmax(axis=1) + 1, 0)


def test_a_healthy_batch_raises_a_false_alarm_at_most_at_the_stated_level():
    """True agreement 0.95, at the baseline: over 1,000 audits a batch (20 times the
    50 that gave 5.9% with a 99% interval checked at each), at most 1% of batches."""
    alarms = first_alarms(0.95, 0.95, batches=4000, audits=1000, seed=51)
    assert (alarms > 0).mean() <= LEVEL, (alarms > 0).mean()


def test_the_99_percent_interval_checked_after_every_audit_did_not_hold_its_level():
    """What the test replaces, on the same draws: Wilson's 99% upper end below the
    baseline, checked after each of 50 audits, raised false alarms in about 6%."""
    draws = numpy.random.default_rng(51).random((4000, 50)) < 0.95
    agreed = numpy.cumsum(draws, axis=1)
    raised = [
        any(wilson(int(a), n + 1, 2.576)[1] < 0.95 for n, a in enumerate(row)) for row in agreed
    ]
    assert numpy.mean(raised) > 3 * LEVEL


def test_a_real_fall_from_0_95_to_0_80_is_caught_within_100_audits():
    alarms = first_alarms(0.80, 0.95, batches=2000, audits=400, seed=52)
    assert (alarms > 0).all()
    assert numpy.median(alarms) <= 40 and numpy.quantile(alarms, 0.95) <= 100


@pytest.mark.parametrize(("agreed", "audited"), [(0, 1), (3, 5), (45, 50), (95, 100), (40, 40)])
def test_the_interval_is_the_tests_own_and_holds_the_share_it_saw(agreed, audited):
    low, high = interval(agreed, audited, LEVEL)
    assert 0.0 <= low <= agreed / audited <= high <= 1.0
    # the baseline is rejected exactly when it lies above the interval
    for baseline in (high - 1e-6, high + 1e-3):
        if 0 < baseline < 1:
            assert drifted(agreed, audited, baseline, LEVEL) == (baseline > high)


def test_no_disagreement_is_no_evidence_and_nothing_audited_knows_nothing():
    assert evidence(500, 0, 0.95) < 1 and not drifted(500, 500, 0.999, LEVEL)
    assert interval(0, 0, LEVEL) == (0.0, 1.0)
    assert drifted(0, 1, 1.0, LEVEL)  # (an agreement of 1 is refuted by one audit against it)
