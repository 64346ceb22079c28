"""The code sandbox under test: its test limits, what a test may leave behind (nothing),
what the worker may spend, and hostile code run the way Thyme runs it.

The leftover checks are machine-wide (processes of the sandbox's uid), so the tests that
start sandboxes run one at a time, in one pytest-xdist group (``sandbox`` marker).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from PIL import Image

from common.agents.thyme import run_thyme
from common.agents.trajectory import Trajectory
from common.backends.scripted import JobScript, ScriptedModel
from common.config import AgentSettings, SandboxSettings
from common.contracts import Query
from common.protocols import THYME
from common.sandbox import Sandbox, SandboxUnavailable, cgroup, worker_bytes, workspace
from tests.helpers.hostile_programs import OUT

REPO = Path(__file__).resolve().parents[2]
# small enough that every bomb meets its limit within a second or two
TEST_LIMITS = SandboxSettings(
    wall_s=3.0,
    cpu_s=2,
    memory_mb=512,
    disk_mb=64,
    files=512,
    output_bytes=1 << 18,
    image_pixels=4_000_000,
    view_tokens=4096,
)
# what the worker may spend on one trajectory, whatever the code did (docs/sandbox.md's
# bound, common.sandbox.worker_bytes, plus the interpreter's own churn); and its own CPU
# for reading and checking what one execution handed back
CHURN = 48 << 20
HOST_MEMORY_BOUND = worker_bytes(TEST_LIMITS) + CHURN
HOST_CPU_BOUND_S = 1.5
SANDBOX_UID = 65533


def bubblewrap_or_skip(limits: SandboxSettings = TEST_LIMITS, **options: object) -> Sandbox:
    sandbox = Sandbox(limits, **options)  # type: ignore[arg-type]
    try:
        sandbox.check()
    except SandboxUnavailable as exc:
        if os.environ.get("CI"):
            raise  # CI installs bubblewrap (make setup): its absence is a failure there
        pytest.skip(f"no working sandbox here: {exc}")
    return sandbox


def leftovers() -> list[str]:
    found = [f"process {pid} runs as the sandbox's uid" for pid in pids_of(SANDBOX_UID)]
    found += [f"child process {pid}" for pid in _children()]
    mine = f"{workspace.PREFIX}{os.getpid()}-"
    found += [f"folder {p}" for p in Path("/tmp").glob(f"{mine}*")]
    mounts = Path("/proc/self/mountinfo").read_text()
    found += [f"mount {line.split()[4]}" for line in mounts.splitlines() if mine in line]
    hierarchy = cgroup.find_hierarchy()
    for parent in hierarchy.folders.values() if hierarchy else ():
        found += [f"control group {g}" for g in parent.glob(f"{os.getpid()}-*")]
    return found


def pids_of(uid: int) -> list[int]:
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:
            continue  # it ended while we looked
        uids = next((line.split()[1:] for line in lines if line.startswith("Uid:")), [])
        zombie = any(line.startswith("State:\tZ") for line in lines)  # dead, awaiting init
        if str(uid) in uids and not zombie:
            pids.append(int(status.parent.name))
    return pids


def _children() -> list[int]:
    """This process's children, but its sandbox janitor (which lives as long as it)."""
    children: list[int] = []
    for task in Path("/proc/self/task").iterdir():
        try:
            children += [int(pid) for pid in (task / "children").read_text().split()]
        except OSError:
            continue
    return [pid for pid in children if b"sweep_after(" not in _command(pid)]


def _command(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@dataclass
class HostUse:
    """What this process (the worker) spent: growth of its peak resident memory over
    what it held before, and CPU seconds."""

    memory_growth: int = 0
    cpu_s: float = 0.0


@contextmanager
def host_use() -> Iterator[HostUse]:
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from here
    before, cpu = _status_bytes("VmRSS"), time.process_time()
    use = HostUse()
    yield use
    use.memory_growth = _status_bytes("VmHWM") - before
    use.cpu_s = time.process_time() - cpu


def _status_bytes(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) << 10
    raise KeyError(key)


# -- hostile code through Thyme's entry point ------------------------------------------
LIMITS = AgentSettings(max_steps=3, max_new_tokens=64, sandbox=TEST_LIMITS)
ANSWER = "<think>done</think><answer>B</answer>"
CROP = (
    "from PIL import Image\nimage = Image.open(image_path)\n"
    f"processed_path = '{OUT}/crop.png'\nimage.crop((0, 0, 90, 60)).save(processed_path)\n"
    "print(processed_path)"
)
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def trajectory_of(
    code: str | list[str], sandbox: Sandbox, limits: AgentSettings = LIMITS
) -> Trajectory:
    """A Thyme trajectory whose steps run ``code`` (one program, or one a step), then
    answer."""
    codes = [code] if isinstance(code, str) else code
    steps = [f"<think>run it</think><code>\n```python\n{c}\n```\n</code>" for c in codes]
    script = JobScript(agent_steps=(*steps, ANSWER))
    model = ScriptedModel(protocol=THYME, scripts={"job": script})
    image = Image.new("RGB", (300, 200), (10, 200, 30))
    query = Query("job", image, "What colour?", ("red", "green"))
    return run_thyme(query, model, limits.model_copy(update={"max_steps": len(steps) + 1}), sandbox)


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
    next_job_works(sandbox)
    return said


def next_job_works(sandbox: Sandbox) -> None:
    """The next job on this worker runs as if nothing had happened. Twice at most: a
    busy machine may stop one (its observation is then a warning, for the log); a worker
    the program broke fails both."""
    first = trajectory_of(CROP, sandbox).steps[0]
    if first.images:
        return
    warnings.warn(f"the next job failed once: {first.observation}", stacklevel=2)
    again = trajectory_of(CROP, sandbox).steps[0]
    assert again.images, (first.observation, again.observation)


# -- images whose view outgrows what was saved, at the default limits --------------------
_SAVE_THIN = (
    "from PIL import Image\n"
    f"processed_path = '{OUT}/thin.png'\n"
    "Image.new('RGB', (10_000_000, 1), (9, 9, 9)).save(processed_path)"
)
_FORGE_THIN = (  # four 10,000,000 x 1 images, 40 M pixels: what the limit allows
    "import os, json\n"
    "thin = {'width': 10_000_000, 'height': 1, 'source_width': 10_000_000, 'source_height': 1}\n"
    "head = json.dumps({'images': [thin] * 4, 'text': None, 'printed': '', 'notes': []})\n"
    "os.write(3, head.encode() + b'\\n')\n"
    "row = b'\\0' * 30_000_000\n"
    "for _ in range(4):\n"
    "    os.write(3, row)\n"
    "os._exit(0)"
)
_SAVE_FOUR = (  # four 3162 x 3162 images, 40 M pixels: what the limit allows
    "from PIL import Image\n"
    "for i in range(4):\n"
    f"    Image.new('RGB', (3162, 3162), (i, 9, 9)).save(f'{OUT}/v{{i}}.png')\n"
    f"    print(f'{OUT}/v{{i}}.png')"
)
VIEW_ATTACKS = {  # name: the code of each step
    "thin": [_SAVE_THIN],
    "forged thin": [_FORGE_THIN],
    "accumulating": [_SAVE_FOUR] * 4,
}


def view_attack(name: str, sandbox: Sandbox) -> tuple[HostUse, Trajectory]:
    """Run one of ``VIEW_ATTACKS`` at ``sandbox``'s limits; what the worker spent."""
    limits = AgentSettings(max_new_tokens=64, sandbox=sandbox.limits)
    with host_use() as use:
        trajectory = trajectory_of(VIEW_ATTACKS[name], sandbox, limits)
    return use, trajectory


# -- workers that die or reap, as programs of their own ---------------------------------
KILLED_WORKER = """
import sys
from common.sandbox import Sandbox, probe_request
from tests.helpers.sandbox import TEST_LIMITS
session = Sandbox(TEST_LIMITS, isolation=sys.argv[1]).session()
print(session.workspace.root, flush=True)
code = "open('/mnt/data/started', 'w').close()\\nimport time\\ntime.sleep(60)"
session.run({**probe_request(session), "code": code})
"""


SUBREAPER_WORKER = """
import ctypes, json, pathlib
from common.sandbox import Sandbox, probe_request
from tests.helpers.sandbox import TEST_LIMITS
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
programs = [
    "import time\\ntime.sleep(60)",
    "data = b'x' * (1 << 20)\\nfor _ in range(50):\\n    os.write(1, data)",
    "x = 0\\nwhile True:\\n    x += 1",
]
ended = []
# (1 CPU-s within 6 s of wall clock: a sixth of a core, which a busy machine still gives)
with Sandbox(TEST_LIMITS.model_copy(update={'wall_s': 6.0, 'cpu_s': 1})).session() as session:
    for code in programs:
        execution = session.run({**probe_request(session), "code": code})
        ended.append([execution.stop, execution.detail, round(execution.cpu_s, 2)])
zombies = 0
for task in pathlib.Path("/proc/self/task").iterdir():
    for child in (task / "children").read_text().split():
        if "State:\\tZ" in pathlib.Path(f"/proc/{child}/status").read_text():
            zombies += 1
print(json.dumps({"ended": ended, "zombies": zombies}))
"""


def reaped_by_a_subreaper(script: str = SUBREAPER_WORKER) -> None:
    """Run ``script`` (``SUBREAPER_WORKER`` or a variant) as a worker of its own: its
    three programs end at their three limits and leave it no zombie."""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout)
    stops = [stop for stop, _, _ in said["ended"]]
    assert stops == ["timeout", "output_limit", "cpu_limit"], said["ended"]
    assert said["zombies"] == 0
