"""The sandbox's tests: a working sandbox (or a clear skip), what a test may leave behind
(nothing), and what the worker may spend while hostile code runs."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from common.config import SandboxSettings
from common.sandbox import Sandbox, SandboxUnavailable, cgroup, workspace

# small enough that every bomb meets its limit within a second or two
TEST_LIMITS = SandboxSettings(
    wall_s=3.0,
    cpu_s=2,
    memory_mb=512,
    disk_mb=64,
    files=512,
    output_bytes=1 << 18,
    image_pixels=4_000_000,
)
# what the worker may spend on one execution, whatever the code did (the README's bound:
# the report and stderr caps, and the images as RGB held twice, plus the interpreter's
# own churn); and its own CPU for reading and checking what came back
HOST_MEMORY_BOUND = 2 * TEST_LIMITS.output_bytes + 2 * 3 * TEST_LIMITS.image_pixels + (48 << 20)
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


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return bubblewrap_or_skip()


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """Every test ends with no sandbox process, folder, mount or control group left."""
    yield
    deadline = time.monotonic() + 5
    while (left := leftovers()) and time.monotonic() < deadline:
        time.sleep(0.05)  # a killed process the kernel is still tearing down
    assert not left, left


def leftovers() -> list[str]:
    found = [f"process {pid} runs as the sandbox's uid" for pid in _pids_of(SANDBOX_UID)]
    found += [f"child process {pid}" for pid in _children()]
    mine = f"{workspace.PREFIX}{os.getpid()}-"
    found += [f"folder {p}" for p in Path("/tmp").glob(f"{mine}*")]
    mounts = Path("/proc/self/mountinfo").read_text()
    found += [f"mount {line.split()[4]}" for line in mounts.splitlines() if mine in line]
    hierarchy = cgroup.find_hierarchy()
    for parent in hierarchy.folders.values() if hierarchy else ():
        found += [f"control group {g}" for g in parent.glob(f"{os.getpid()}-*")]
    return found


def _pids_of(uid: int) -> list[int]:
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
