"""Choosing tau with a guarantee: learn then test, by fixed-sequence testing.

Given calibration items, each with the gate's confidence in the small model's answer and
whether that answer is wrong, and a grid of thresholds walked from the strictest down:

1. at each tau_j, n_j items are accepted (confidence > tau_j, the gate's own rule) and
   k_j of them are wrong;
2. the null hypothesis "the error rate of answers accepted at tau_j exceeds epsilon" has
   the exact binomial p-value p_j = P(Binomial(n_j, epsilon) <= k_j);
3. walk the grid from the strictest tau and stop at the first p_j > delta; every tau
   before it is certified, and the loosest certified tau is the answer.

With probability at least 1 - delta over the draw of the calibration set, the chosen
tau's error rate on new items from the same distribution is at most epsilon (Angelopoulos,
Bates, Candès, Jordan, Lei, 2021: "Learn then Test"). Items are assumed exchangeable
with future ones: a drifting corpus breaks that. A threshold that accepts too few
calibration items to be certified even with none of them wrong ((1 - epsilon)^n > delta)
is passed over, never certified: given the number accepted, the wrong ones are binomial,
so deciding on n alone keeps every test exact. No certified tau is an answer too: then
there is none, and nothing is picked anyway.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from common.config import GateSettings
from common.pipeline.gate import score_answers
from common.scores import GateResult, accepts, decode


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) <= k), summed in log space (exact for any n a corpus has)."""
    if k >= n:
        return 1.0
    if k < 0:
        return 0.0
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(k + 1):
        log_term = (
            math.lgamma(n + 1)
            - math.lgamma(i + 1)
            - math.lgamma(n - i + 1)
            + i * log_p
            + (n - i) * log_q
        )
        total += math.exp(log_term)
    return min(1.0, total)


@dataclass(frozen=True)
class TauTest:
    tau: float
    accepted: int  # n_j
    wrong: int  # k_j
    p_value: float  # NaN once the walk has stopped (not tested)
    certified: bool


@dataclass
class TauChoice:
    max_error: float
    delta: float
    tau: float | None  # the loosest certified threshold; None: none meets the target
    tests: list[TauTest] = field(default_factory=list)  # strictest first, as walked

    @property
    def certified(self) -> list[TauTest]:
        return [test for test in self.tests if test.certified]


def pick_tau(
    confidences: Sequence[float],
    wrong: Sequence[bool],
    taus: Sequence[float],
    *,
    max_error: float,
    delta: float,
) -> TauChoice:
    """The loosest tau whose accepted answers' error rate is at most ``max_error`` with
    probability at least 1 - ``delta`` (fixed-sequence testing over ``taus``)."""
    if len(confidences) != len(wrong):
        raise ValueError("one wrong/right flag per confidence")
    if not (0.0 < max_error < 1.0 and 0.0 < delta < 1.0):
        raise ValueError("max_error and delta must lie strictly between 0 and 1")
    # Sorted once: the items a tau accepts are a suffix (confidence > tau, as the gate says).
    ordered = sorted(zip(confidences, wrong, strict=True))
    values = [conf for conf, _ in ordered]
    wrong_after = [0] * (len(ordered) + 1)  # wrong answers among ordered[i:]
    for i in range(len(ordered) - 1, -1, -1):
        wrong_after[i] = wrong_after[i + 1] + bool(ordered[i][1])
    choice = TauChoice(max_error, delta, None)
    walking = True
    for tau in sorted(set(taus), reverse=True):
        first = bisect.bisect_right(values, tau)  # from here on: confidence > tau (accepts)
        n, k = len(values) - first, wrong_after[first]
        # Too few accepted items to reject even with none wrong: untestable, passed over.
        testable = binomial_cdf(0, n, max_error) <= delta
        p_value = binomial_cdf(k, n, max_error) if walking and testable else math.nan
        certified = walking and testable and p_value <= delta
        if walking and testable and not certified:
            walking = False  # the first hypothesis not rejected ends the sequence
        choice.tests.append(TauTest(tau, n, k, p_value, certified))
        if certified:
            choice.tau = tau
    return choice


def default_grid() -> list[float]:
    """Thresholds from 0.5 to 0.9999, finer near 1 where the gate's edge usually lies."""
    coarse = [round(0.5 + 0.01 * i, 4) for i in range(45)]  # 0.50 .. 0.94
    fine = [round(0.95 + 0.001 * i, 4) for i in range(50)]  # 0.950 .. 0.999
    return coarse + fine + [0.9995, 0.9999]


@dataclass(frozen=True)
class SweepRow:
    mode: str
    top_k: int
    tau: float
    accepted: float  # share of jobs the funnel would answer with the small model
    accepted_accuracy: float  # of those, right (NaN: none accepted)
    accuracy: float  # all jobs: the small answer where accepted, the agent's elsewhere
    agreement: float  # of the accepted answers, the share the agent would have given too
    speedup: float = math.nan  # agent-only seconds per job over the funnel's (estimated)


def replay(records: list[str], gate: GateSettings) -> list[GateResult]:
    """The gate's decisions on recorded answers (K <= the recorded width)."""
    answers = [decode(record) for record in records]
    widest = min((len(row) for a in answers for row in a.top_values), default=gate.top_k)
    if gate.top_k > widest:
        raise ValueError(f"K={gate.top_k} needs more logits than the run kept ({widest})")
    return score_answers(answers, gate)


def sweep(
    items: Sequence[Any],
    modes: Sequence[str],
    top_ks: Sequence[int],
    taus: Sequence[float],
    costs: tuple[float, float] | None = None,
) -> list[SweepRow]:
    """Replay every gate (mode x K x tau) over a calibration run's recorded logits.

    ``costs`` (fast-stage and agent seconds per job, measured in the run) give each
    setting's estimated speedup over the agent alone: agent / (fast + rejected x agent).
    """
    answers = [decode(item.replay) for item in items]
    rows = []
    for mode in modes:
        for top_k in top_ks:
            gate = GateSettings(mode=mode, top_k=top_k, threshold=0.5)
            confidences = [result.confidence for result in score_answers(answers, gate)]
            for tau in taus:
                taken = [
                    item.tool_free and n > 0 and accepts(confidence, tau)
                    for item, confidence, n in zip(
                        items, confidences, (a.num_tokens for a in answers), strict=True
                    )
                ]
                right = [i.right for i, t in zip(items, taken, strict=True) if t]
                agree = [bool(i.agrees) for i, t in zip(items, taken, strict=True) if t]
                overall = [
                    i.right if t else bool(i.agent_right) for i, t in zip(items, taken, strict=True)
                ]
                share = sum(taken) / len(items)
                speedup = math.nan
                if costs is not None and costs[1] > 0:
                    fast_s, agent_s = costs
                    speedup = agent_s / (fast_s + (1 - share) * agent_s)
                rows.append(
                    SweepRow(
                        mode,
                        top_k,
                        tau,
                        share,
                        sum(right) / len(right) if right else math.nan,
                        sum(overall) / len(overall),
                        sum(agree) / len(agree) if agree else math.nan,
                        speedup,
                    )
                )
    return rows
