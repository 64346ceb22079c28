"""The audit's drift test: do a batch's accepted answers still agree with the agent as
often as the baseline says? It is asked after every audit, so its false-alarm rate must
hold over every look, not at one: a 99% interval checked after each of 50 audits raised
a false alarm in 5.9% of healthy batches.

The evidence that the agreement fell below the baseline ``p`` is a likelihood ratio
against ``p``, averaged over a few agreements below it (``q = p - d``, ``d`` in
``DROPS``), after ``a`` agreeing and ``b`` disagreeing audits::

    E = mean over d of (q / p)^a * ((1 - q) / (1 - p))^b

While the agreement is ``p`` or more, ``E`` starts at 1 and is expected to shrink with
each audit (a nonnegative supermartingale), so by Ville's inequality the chance that it
ever reaches ``1 / level``, however many audits the batch takes, is at most ``level``.
The alarm is ``E >= 1 / level``. A real fall is still caught: from 0.95 to 0.80, in a
median of about 32 audits and within 100 in 95% of batches at level 0.01
(``tests/common/pipeline/test_drift.py`` simulates both).

The interval shown beside it is the same test's, both ways (``interval``): the
agreements neither side of it rejects, valid at every look, so its upper end falls
below the baseline when the alarm is raised.
"""

from __future__ import annotations

from typing import Any

import numpy

# the falls in agreement the evidence is averaged over (each weighs the same)
DROPS = (0.05, 0.10, 0.15, 0.20, 0.30, 0.45)
_EDGE = 1e-9  # an agreement of exactly 0 or 1 is refuted by one audit against it
_STEPS = 50  # bisection steps for an interval end (2^-50: exact to print)


def evidence(agreed: Any, disagreed: Any, baseline: float) -> Any:
    """``E`` of the module's docstring: how far ``agreed`` and ``disagreed`` audits speak
    against an agreement of ``baseline`` or more; numbers, or numpy arrays of them."""
    return _mixture(agreed, disagreed, baseline, below=True)


def drifted(agreed: int, audited: int, baseline: float, level: float) -> bool:
    """Whether the audits reject an agreement of ``baseline`` or more at ``level``."""
    return bool(evidence(agreed, audited - agreed, baseline) >= 1 / level)


def interval(agreed: int, audited: int, level: float) -> tuple[float, float]:
    """The agreements the audits reject on neither side at ``level``: ``(low, high)``,
    valid at every look ((0, 1) with nothing audited)."""
    if audited == 0:
        return 0.0, 1.0
    disagreed = audited - agreed
    bar = 1 / level

    def rejected_from_below(p: float) -> bool:  # (grows with p: the test above)
        return bool(_mixture(agreed, disagreed, p, below=True) >= bar)

    def rejected_from_above(p: float) -> bool:  # (shrinks with p)
        return bool(_mixture(agreed, disagreed, p, below=False) >= bar)

    return _edge(rejected_from_above, low=True), _edge(rejected_from_below, low=False)


def _mixture(agreed: Any, disagreed: Any, p: float, *, below: bool) -> Any:
    p = min(max(p, _EDGE), 1 - _EDGE)
    a = numpy.asarray(agreed, dtype=float)
    b = numpy.asarray(disagreed, dtype=float)
    alternatives = [p - d if below else p + d for d in DROPS]
    alternatives = [q for q in alternatives if 0 < q < 1]
    if not alternatives:
        return numpy.ones_like(a) if a.ndim else 1.0
    with numpy.errstate(over="ignore"):
        ratios = [
            numpy.exp(a * numpy.log(q / p) + b * numpy.log((1 - q) / (1 - p))) for q in alternatives
        ]
    total = sum(ratios) / len(alternatives)
    return total if a.ndim else float(total)


def _edge(rejected: Any, *, low: bool) -> float:
    """The end of the agreements not rejected: the last ``p`` from 0 (``low``: from 1)
    that ``rejected`` holds for, by bisection."""
    inside, outside = (1.0, 0.0) if low else (0.0, 1.0)
    if not rejected(outside):
        return outside
    for _ in range(_STEPS):
        middle = (inside + outside) / 2
        if rejected(middle):
            outside = middle
        else:
            inside = middle
    return inside
