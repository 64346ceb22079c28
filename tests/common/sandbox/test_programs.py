"""Every hostile program through Thyme's entry point: contained, observed, bounded, gone.

For each program of ``programs.PROGRAMS`` (and the outside reviewer's set in ``outside/``)
one trajectory runs it as its first step, then answers. The test asserts what the
issue's "done when" asks of each:

- it is stopped or contained, with a clear observation (or output), and its code kept;
- the trajectory goes on to its answer, and the next job on the same worker runs as ever;
- the worker's memory and CPU stay within the bound stated in the README, and the
  sandbox's within its limits;
- nothing is left behind: no process, folder, mount or control group (``conftest``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from PIL import Image

from common.agents.thyme import run_thyme
from common.agents.trajectory import Trajectory
from common.backends.scripted import JobScript, ScriptedModel
from common.config import AgentSettings
from common.contracts import Query
from common.protocols import THYME
from common.sandbox import Sandbox
from tests.common.sandbox.conftest import (
    HOST_CPU_BOUND_S,
    HOST_MEMORY_BOUND,
    TEST_LIMITS,
    host_use,
)
from tests.common.sandbox.programs import OUT, PROGRAMS

LIMITS = AgentSettings(max_steps=3, max_new_tokens=64, sandbox=TEST_LIMITS)
ANSWER = "<think>done</think><answer>B</answer>"
CROP = (
    "from PIL import Image\nimage = Image.open(image_path)\n"
    f"processed_path = '{OUT}/crop.png'\nimage.crop((0, 0, 90, 60)).save(processed_path)\n"
    "print(processed_path)"
)
OUTSIDE = sorted((Path(__file__).parent / "outside").glob("*.py"))
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def trajectory_of(code: str, sandbox: Sandbox) -> Trajectory:
    step = f"<think>run it</think><code>\n```python\n{code}\n```\n</code>"
    model = ScriptedModel(protocol=THYME, scripts={"job": JobScript(agent_steps=(step, ANSWER))})
    image = Image.new("RGB", (300, 200), (10, 200, 30))
    return run_thyme(Query("job", image, "What colour?", ("red", "green")), model, LIMITS, sandbox)


def contained(code: str, sandbox: Sandbox) -> str:
    """Run ``code`` as a hostile step and check what every program must meet; what the
    step observed and printed, for the caller's own check."""
    with host_use() as use:
        trajectory = trajectory_of(code, sandbox)
    first = trajectory.steps[0]
    said = f"{first.observation} | printed: {first.code_output}"
    assert first.code is not None and first.observation, first  # kept, with its code
    assert trajectory.answer == "B", trajectory  # the trajectory went on
    assert not CONTROL.search(said), said
    assert use.memory_growth <= HOST_MEMORY_BOUND, f"the worker grew {use.memory_growth >> 20} MiB"
    assert use.cpu_s <= HOST_CPU_BOUND_S, f"the worker spent {use.cpu_s:.2f} CPU s"
    assert first.sandbox_peak_mb is not None and first.sandbox_peak_mb <= TEST_LIMITS.memory_mb
    assert first.sandbox_cpu_s is not None and first.sandbox_cpu_s <= TEST_LIMITS.cpu_s + 0.5
    # the next job on this worker: as if nothing had happened
    assert trajectory_of(CROP, sandbox).steps[0].images
    return said


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
