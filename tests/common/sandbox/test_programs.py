"""Every hostile program through Thyme's entry point: contained, observed, bounded, gone.

For each program of ``tests/helpers/hostile_programs.py`` (and the outside reviewer's
set in ``outside/``) one trajectory runs it as its first step, then answers
(``tests.helpers.sandbox.contained``), which asserts what the issue's "done when" asks
of each:

- it is stopped or contained, with a clear observation (or output), and its code kept;
- the trajectory goes on to its answer, and the next job on the same worker runs as ever;
- the worker's memory and CPU stay within the bound stated in the README, and the
  sandbox's within its limits;
- nothing is left behind: no process, folder, mount or control group (``conftest``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.hostile_programs import PROGRAMS
from tests.helpers.sandbox import contained

OUTSIDE = sorted((Path(__file__).parent / "outside").glob("*.py"))


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_a_hostile_program_is_contained(program, sandbox):
    said = contained(program.code, sandbox)
    assert any(word in said for word in program.said), (program.said, said)


@pytest.mark.parametrize("path", OUTSIDE, ids=[p.stem for p in OUTSIDE])
def test_the_outside_reviewers_programs_are_contained(path, sandbox):
    contained(path.read_text(), sandbox)


def test_the_corpus_covers_every_class_of_the_issue():
    kinds = {program.kind for program in PROGRAMS}
    assert kinds >= {
        "pid1",
        "setuid",
        "memory",
        "tasks",
        "syscalls",
        "disk",
        "outputs",
        "decoders",
        "forged",
        "names",
        "text",
    }
    assert len(PROGRAMS) >= 30
