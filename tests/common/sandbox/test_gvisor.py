"""The same guest under gVisor (``isolation="gvisor"``): Thyme's code runs, and the
corpus's hostile programs, one of each class and every bomb, are contained as under
bubblewrap (what they observe may differ: gVisor shows its own /proc and /dev/shm)."""

from __future__ import annotations

import pytest

from common.sandbox import Sandbox, probe_request
from tests.common.sandbox.conftest import TEST_LIMITS, bubblewrap_or_skip
from tests.common.sandbox.programs import PROGRAMS
from tests.common.sandbox.test_programs import CROP, contained, trajectory_of

BOMBS = {"memory", "tasks", "disk"}
CHOSEN = [p for i, p in enumerate(PROGRAMS) if p.kind in BOMBS or PROGRAMS[i - 1].kind != p.kind]


@pytest.fixture(scope="module")
def gvisor() -> Sandbox:
    return bubblewrap_or_skip(TEST_LIMITS, isolation="gvisor")


def test_thyme_code_runs_under_gvisor_as_our_uid(gvisor):
    assert trajectory_of(CROP, gvisor).steps[0].images
    with gvisor.session(spare=False) as session:
        run = session.run({**probe_request(session), "code": "print(os.getuid(), os.getpid())"})
    assert run.report is not None and run.report.text == "65533 1"


@pytest.mark.parametrize("program", CHOSEN, ids=[p.name for p in CHOSEN])
def test_a_hostile_program_is_contained_under_gvisor(program, gvisor):
    contained(program.code, gvisor)
