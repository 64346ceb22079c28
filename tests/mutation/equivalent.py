"""Surviving mutants judged equivalent: the program behaves the same under them, so no
test can kill them. Each names its module, a piece of the source line it changes, the
operator (a regular expression over cosmic-ray's names) and why it changes nothing.
``python -m tests.mutation report`` counts them apart (docs/testing.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Equivalent:
    module: str
    line: str
    operator: str
    why: str


EQUIVALENT: tuple[Equivalent, ...] = (
    Equivalent(
        "reconcile",
        "*,",
        r"core/ReplaceBinaryOperator_Mul_Div",
        "the keyword-only marker made positional-only ('/'): every caller passes the same way",
    ),
    Equivalent(
        "reconcile",
        "leader: bool = False",
        r"core/ReplaceFalseWithTrue",
        "a default every sweep sets before it is read (hold_lease's answer)",
    ),
    Equivalent("reconcile", "if result.resent:", r"core/AddNot", "it guards a log line only"),
    Equivalent(
        "reconcile",
        '"after a restart or a death" if at_once else',
        r"core/AddNot",
        "the wording of a log line",
    ),
)
