"""The same guest under gVisor (``isolation="gvisor"``): Thyme's code runs, and the
corpus's hostile programs, one of each class and every bomb, are contained as under
bubblewrap (what they observe may differ: gVisor shows its own /proc and /dev/shm)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.config import SandboxSettings
from common.sandbox import Sandbox, SandboxUnavailable, probe_request
from tests.helpers.hostile_programs import INT80, PROGRAMS
from tests.helpers.sandbox import (
    CROP,
    SUBREAPER_WORKER,
    TEST_LIMITS,
    bubblewrap_or_skip,
    contained,
    reaped_by_a_subreaper,
    trajectory_of,
)

BOMBS = {"memory", "tasks", "disk"}
# the third review's programs (outside/40_ and on) were written against gVisor too
THIRD_REVIEW = sorted(p for p in (Path(__file__).parent / "outside").glob("*.py") if p.name >= "40")
CHOSEN = [p for i, p in enumerate(PROGRAMS) if p.kind in BOMBS or PROGRAMS[i - 1].kind != p.kind]


@pytest.fixture(scope="module")
def gvisor() -> Sandbox:
    return bubblewrap_or_skip(TEST_LIMITS, isolation="gvisor")


def test_thyme_code_runs_under_gvisor_as_our_uid(gvisor):
    assert trajectory_of(CROP, gvisor).steps[0].images
    with gvisor.session(spare=False) as session:
        run = session.run({**probe_request(session), "code": "print(os.getuid(), os.getpid())"})
    assert run.report is not None and run.report.text == "65533 2"  # (PID 1: the init)


@pytest.mark.parametrize("program", CHOSEN, ids=[p.name for p in CHOSEN])
def test_a_hostile_program_is_contained_under_gvisor(program, gvisor):
    contained(program.code, gvisor)


@pytest.mark.parametrize("path", THIRD_REVIEW, ids=[p.stem for p in THIRD_REVIEW])
def test_the_third_reviews_programs_are_contained_under_gvisor(path, gvisor):
    contained(path.read_text(), gvisor)


def test_a_missing_runsc_is_one_clear_error():
    with pytest.raises(SandboxUnavailable, match=r"gVisor sandbox needs 'no-such-runsc'.*runsc"):
        Sandbox(SandboxSettings(runsc="no-such-runsc"), isolation="gvisor").check()


def test_a_worker_that_reaps_orphans_is_left_no_zombies_by_gvisor(gvisor):
    """runsc starts its sandbox in a session of its own: a worker that is PID 1 or a
    subreaper inherits its helpers, and the session reaps them."""

    script = SUBREAPER_WORKER.replace(
        "Sandbox(TEST_LIMITS", 'Sandbox(isolation="gvisor", limits=TEST_LIMITS'
    )
    # runsc's own CPU is the group's too: a guest that only sleeps was charged 1.04 CPU-s
    # in its 6 s on a machine at three times its load, and one writing past its output
    # cap 1.16. Two CPU-s in eight of wall clock (a quarter of a core) keeps each limit
    # the one its program meets first.
    script = script.replace("'wall_s': 6.0, 'cpu_s': 1", "'wall_s': 8.0, 'cpu_s': 2")
    assert "'cpu_s': 2" in script
    reaped_by_a_subreaper(script)


@pytest.mark.parametrize(
    ("number", "call"), [(2, "fork (i386), open (x86_64)"), (57, "fork (x86_64)")]
)
def test_under_gvisor_int_0x80_is_no_32_bit_call(number, call, gvisor):
    """gVisor has no 32-bit ABI to reach: ``int 0x80`` runs the 64-bit call of its number,
    through the same allowlist (under bubblewrap it is SIGSYS: test_programs.py). So 2 is
    open (allowed: on whatever its registers point at, it may even succeed), 57 is fork
    (refused); neither forks."""
    code = INT80.replace("\\xb8\\x14", f"\\xb8\\x{number:02x}")
    assert code != INT80
    code = code.replace(
        "print(ctypes.CFUNCTYPE(ctypes.c_int)(address)())",
        "returned = ctypes.CFUNCTYPE(ctypes.c_int)(address)()\n"
        "try:\n    os.waitpid(-1, os.WNOHANG)\n    child = 'a-child'\n"
        "except Exception:  # (no child to wait for)\n    child = 'no-child'\n"
        "print(returned, child)",
    )
    with gvisor.session(spare=False) as session:
        run = session.run({**probe_request(session), "code": code})
    assert run.report is not None, run  # not killed: the call ran as a 64-bit one ...
    said = run.report.printed.splitlines()
    assert len(said) == 1 and said[0].split()[1] == "no-child", (call, run.report)  # ... one
    if number == 57:  # process, with no child: fork is refused
        assert int(said[0].split()[0]) < 0, run.report
