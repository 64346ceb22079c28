"""The README's test command runs both lanes whatever the first does, and its last line
counts both (tests/lanes.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.lanes import Lane, verdict

ROOT = Path(__file__).resolve().parent.parent
SUITE = """
import pytest

def test_fails():
    assert False

@pytest.mark.sandbox
def test_in_the_sandbox_lane():
    pass
"""


@pytest.mark.parametrize("serial", [False, True], ids=["together", "serial"])
def test_a_failing_first_lane_still_runs_the_second_and_the_last_line_counts_both(tmp_path, serial):
    (tmp_path / "test_suite.py").write_text(SUITE)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    sandbox: x\n    soak: x\n")
    command = [sys.executable, "-m", "tests.lanes", "--workers", "1", str(tmp_path)]
    done = subprocess.run(
        [*command, *(["--serial"] if serial else [])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 1, done.stdout[-2000:]
    assert lines[-3].startswith("parallel lane: 1 failed in ")
    assert lines[-2].startswith("sandbox lane: 1 passed in ")
    assert lines[-1].startswith("make test FAILED: both lanes, 1 failed, 1 passed in ")
    # the sandbox lane's own output is shown, after the first lane's
    assert done.stdout.index("-- sandbox lane") > done.stdout.index("test_fails")


def test_nothing_selected_in_a_lane_is_no_failure():
    lanes = [Lane("parallel", [], code=0, counts={"passed": 3}), Lane("sandbox", [], code=5)]
    assert verdict(lanes, 61.0) == "make test passed: both lanes, 3 passed in 1:01"
