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


EQUIVALENT: tuple[Equivalent, ...] = ()
