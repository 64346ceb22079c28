"""Control groups for sandbox sessions: found in either cgroup version, made with their
limits, joined before anything runs, emptied and removed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from common.sandbox import Sandbox, cgroup, probe_request
from common.sandbox.cgroup import Hierarchy, SessionGroup, find_hierarchy
from tests.helpers.sandbox import TEST_LIMITS
from tests.helpers.waiting import wait_until

V1_MOUNTS = """\
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V1_GROUPS = "8:pids:/\n4:memory:/jobs/worker-1\n2:cpuacct:/\n1:cpu:/\n0::/\n"


def test_cgroup_v1_groups_go_below_the_workers_own_in_each_controller():
    hierarchy = find_hierarchy(V1_MOUNTS, V1_GROUPS)
    assert hierarchy == Hierarchy(
        1,
        {
            "memory": Path("/sys/fs/cgroup/memory/jobs/worker-1/speceyes-sandbox"),
            "pids": Path("/sys/fs/cgroup/pids/speceyes-sandbox"),
            "cpu": Path("/sys/fs/cgroup/cpu/speceyes-sandbox"),
            "cpuacct": Path("/sys/fs/cgroup/cpuacct/speceyes-sandbox"),
        },
    )


def test_cgroup_v2_groups_go_beside_the_workers_own(tmp_path):
    (tmp_path / "system.slice").mkdir()
    (tmp_path / "system.slice" / "cgroup.subtree_control").write_text("cpu memory pids\n")
    mounts = f"30 23 0:26 / {tmp_path} rw,nosuid - cgroup2 cgroup2 rw\n"
    hierarchy = find_hierarchy(mounts, "0::/system.slice/worker.service\n")
    assert hierarchy == Hierarchy(2, {"unified": tmp_path / "system.slice/speceyes-sandbox"})
    (tmp_path / "system.slice" / "cgroup.subtree_control").write_text("cpu\n")
    assert find_hierarchy(mounts, "0::/system.slice/worker.service\n") is None  # no memory
    assert find_hierarchy("", "") is None


def test_a_v2_group_is_made_with_its_limits(tmp_path):
    parent = tmp_path / "speceyes-sandbox"
    group = SessionGroup.create(
        Hierarchy(2, {"unified": parent}), "123-abc", memory_bytes=512 << 20, tasks=32
    )
    assert group is not None
    folder = parent / "123-abc"
    assert (parent / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert (folder / "memory.max").read_text() == str(512 << 20)
    assert (folder / "memory.swap.max").read_text() == "0"
    assert (folder / "pids.max").read_text() == "32"
    assert (folder / "cpu.max").read_text() == "100000 100000"
    (folder / "cgroup.procs").write_text("")
    (folder / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    (folder / "memory.peak").write_text("1048576\n")
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    usage = group.usage()
    assert (usage.cpu_s, usage.peak_bytes, usage.oom_kills) == (2.5, 1 << 20, 1)
    group.start_count()  # one execution's use from here (the kernel resets the peak)
    assert group.usage() == cgroup.Usage(0.0, 0, 0)
    assert group.join_command()[:2] == ["/bin/sh", "-c"]


def test_no_hierarchy_means_no_group_and_a_failing_one_is_an_error(tmp_path):
    assert SessionGroup.create(None, "x", memory_bytes=1, tasks=1) is None
    unwritable = Hierarchy(2, {"unified": tmp_path / "missing" / "deeper"})
    with pytest.raises(OSError):  # the machine has groups: a session never runs without
        SessionGroup.create(unwritable, "x", memory_bytes=1, tasks=1)


@pytest.fixture
def real() -> Hierarchy:
    hierarchy = find_hierarchy() if os.geteuid() == 0 else None
    if hierarchy is None:
        pytest.skip("no control groups this process may make")
    return hierarchy


def test_a_real_group_holds_what_joins_it_and_is_emptied(real):
    group = SessionGroup.create(real, f"{os.getpid()}-real", memory_bytes=256 << 20, tasks=8)
    assert group is not None
    try:
        process = subprocess.Popen([*group.join_command(), "sleep", "60"])
        try:
            # the shell is starting; it joins, then execs sleep
            wait_until(
                lambda: group.pids() == [process.pid],
                deadline_s=5,
                every_s=0.01,
                what=lambda: f"only the process in the group, not {group.pids()}",
            )
            assert group.kill() and group.pids() == []
            assert process.wait(5) == -9
        finally:
            process.kill()
    finally:
        group.remove()
    assert not any((parent / f"{os.getpid()}-real").exists() for parent in real.folders.values())


def test_the_groups_of_a_dead_worker_are_swept(real):
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = SessionGroup.create(real, f"{gone.pid}-stale", memory_bytes=1 << 30, tasks=8)
    assert stale is not None
    cgroup.sweep_stale(real)
    assert not any(folder.exists() for folder in stale.folders.values())


def _memory_groups() -> int:
    for line in Path("/proc/cgroups").read_text().splitlines():
        fields = line.split()
        if fields[0] == "memory":
            return int(fields[2])
    raise LookupError("no memory controller")


def test_sessions_that_read_the_hosts_files_leave_no_dying_groups(real, tmp_path):
    """Pages a guest brings into the page cache are charged to its group, which the
    kernel keeps (dying) while they live: removing a group gives them back first."""
    files = (
        sorted(Path("/usr/lib/x86_64-linux-gnu").glob("*.so*"))[:200]
        or sorted(Path("/usr/lib").rglob("*.py"))[:200]
    )
    read = f"paths = {[str(f) for f in files]!r}\nfor path in paths:\n    open(path, 'rb').read()"
    before = _memory_groups()
    # (read at the disk's speed: what is tested is the page cache, not the I/O throttle)
    sandbox = Sandbox(TEST_LIMITS.model_copy(update={"io_mb_s": 100_000, "io_ops_s": 100_000}))
    for _ in range(5):
        for path in files:  # out of the cache, so that the guest's reads charge its group
            handle = os.open(path, os.O_RDONLY)
            os.posix_fadvise(handle, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(handle)
        with sandbox.session(spare=False) as session:
            run = session.run({**probe_request(session), "code": read})
            assert run.report is not None and run.report.error is None, run
    assert _memory_groups() - before <= 1  # (1: another process's group coming or going)


def test_a_killed_worker_not_yet_reaped_is_not_alive():
    """Its janitor wakes when it ends, maybe before its parent reaps it: a zombie's
    groups and folders are swept, not kept for a worker that will never come back."""
    worker = subprocess.Popen(["sleep", "60"])
    try:
        assert cgroup.alive(worker.pid)
        worker.kill()
        wait_until(
            lambda: Path(f"/proc/{worker.pid}/stat").read_text().split(") ")[1][0] == "Z",
            deadline_s=10,
            what="the killed process to be a zombie",
        )
        assert not cgroup.alive(worker.pid)  # (its parent, this test, has not reaped it)
    finally:
        worker.kill()
        worker.wait()
    assert not cgroup.alive(worker.pid)
