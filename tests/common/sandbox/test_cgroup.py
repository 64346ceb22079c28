"""Control groups for sandbox sessions: found in either cgroup version, made with their
limits, joined before anything runs, emptied and removed."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

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


# -- the kernel's files, faked: what is written where, and what a refusal does -------------
@pytest.fixture
def kernel(monkeypatch, tmp_path):
    """Cgroup files as plain files under ``tmp_path``; a name in ``kernel.refused`` is
    refused as the kernel refuses a file it lacks or a value it will not take (EINVAL);
    ``kernel.written`` keeps every (name, value) written, in order (io.max takes one rule
    a write, as the kernel's does). Block devices: ``kernel.devices``."""
    import builtins
    import errno

    kernel = SimpleNamespace(refused=set(), written=[], devices=["8:0", "259:0"])
    real_open = builtins.open

    def fake_open(path, mode="r", *args, **kwargs):
        if Path(path).name in kernel.refused:
            raise OSError(errno.EINVAL, "refused", str(path))
        handle = real_open(path, mode, *args, **kwargs)
        if "w" in mode:
            write = handle.write
            handle.write = lambda value: (
                kernel.written.append((Path(path).name, value)),
                write(value),
            )[1]
        return handle

    monkeypatch.setattr(cgroup, "open", fake_open, raising=False)
    monkeypatch.setattr(cgroup, "block_devices", lambda: kernel.devices)
    return kernel


def test_v1_groups_are_made_in_each_controller_with_their_limits(kernel, tmp_path):
    folders = {c: tmp_path / c / "speceyes-sandbox" for c in ("memory", "pids", "cpu", "cpuacct")}
    for folder in folders.values():
        folder.parent.mkdir()
    hierarchy = Hierarchy(1, folders)
    for name in ("1-a", "1-b"):  # (the second finds the parents made)
        assert SessionGroup.create(hierarchy, name, memory_bytes=1 << 20, tasks=8) is not None
    limits = dict(kernel.written[:6])
    assert limits == {
        "memory.limit_in_bytes": str(1 << 20),
        "memory.memsw.limit_in_bytes": str(1 << 20),
        "memory.swappiness": "0",
        "pids.max": "8",
        "cpu.cfs_period_us": "100000",
        "cpu.cfs_quota_us": "100000",
    }
    # a kernel without swap accounting lacks two files: the group is made without them
    kernel.refused = {"memory.memsw.limit_in_bytes", "memory.swappiness", "memory.swap.max"}
    assert SessionGroup.create(hierarchy, "1-c", memory_bytes=1, tasks=1) is not None
    v2 = Hierarchy(2, {"unified": tmp_path / "v2" / "speceyes-sandbox"})
    (tmp_path / "v2").mkdir()
    for name in ("1-d", "1-f"):  # (the second finds the parent made)
        assert SessionGroup.create(v2, name, memory_bytes=1, tasks=1) is not None
    # one it needs refused: an error, never a session without it
    for needed in ("pids.max", "memory.max"):
        kernel.refused = {needed}
        with pytest.raises(OSError):
            SessionGroup.create(
                hierarchy if needed == "pids.max" else v2, f"1-{needed}", memory_bytes=1, tasks=1
            )


def test_disk_io_is_throttled_on_every_device_in_either_version(kernel, tmp_path, caplog):
    io = cgroup.IoLimit(bytes_s=64 << 20, ops_s=1000)
    unified = tmp_path / "v2" / "speceyes-sandbox"
    unified.parent.mkdir()
    assert SessionGroup.create(
        Hierarchy(2, {"unified": unified}, io=True), "1-a", memory_bytes=1, tasks=1, io=io
    )
    rules = [value for name, value in kernel.written if name == "io.max"]
    rates = f"rbps={64 << 20} wbps={64 << 20} riops=1000 wiops=1000"
    assert rules == [f"8:0 {rates}", f"259:0 {rates}"]
    assert ("cgroup.subtree_control", "+memory +pids +cpu +io") in kernel.written

    kernel.written.clear()
    folders = {c: tmp_path / c / "sb" for c in ("memory", "pids", "cpu", "cpuacct", "blkio")}
    for folder in folders.values():
        folder.parent.mkdir()
    SessionGroup.create(Hierarchy(1, folders), "1-b", memory_bytes=1, tasks=1, io=io)
    throttled = [(n, v) for n, v in kernel.written if n.startswith("blkio.")]
    assert throttled == [
        (f"blkio.throttle.{direction}_{kind}_device", f"{device} {value}")
        for device in ("8:0", "259:0")
        for kind, value in (("bps", 64 << 20), ("iops", 1000))
        for direction in ("read", "write")
    ]

    # without the controller nothing is written; a device that refuses a rule is passed
    # over, and where every one refuses, the log says disk I/O is unlimited
    kernel.written.clear()
    other = tmp_path / "v2b" / "sb"
    other.parent.mkdir()
    SessionGroup.create(
        Hierarchy(2, {"unified": other}, io=False), "1-c", memory_bytes=1, tasks=1, io=io
    )
    assert not [n for n, _ in kernel.written if n == "io.max"]
    assert "disk I/O is unlimited" not in caplog.text  # (every device took it above)
    kernel.refused = {"io.max"}
    third = tmp_path / "v2c" / "sb"
    third.parent.mkdir()
    with caplog.at_level("WARNING"):
        SessionGroup.create(
            Hierarchy(2, {"unified": third}, io=True), "1-d", memory_bytes=1, tasks=1, io=io
        )
    assert "disk I/O is unlimited" in caplog.text


def test_a_process_joins_every_hierarchys_group_before_it_runs(tmp_path):
    folders = {c: tmp_path / c for c in ("memory", "pids", "cpu")}
    group = SessionGroup(Hierarchy(1, folders), "g")
    for folder in group.folders.values():
        folder.mkdir(parents=True)
    command = [*group.join_command(), "echo", "inside"]  # (run where a stray write is harmless)
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert done.stdout == "inside\n"
    assert [(f / "cgroup.procs").read_text() for f in group.folders.values()] == ["0\n"] * 3


def test_the_counts_are_read_from_either_versions_files(tmp_path):
    folders = {c: tmp_path / c for c in ("memory", "pids", "cpu", "cpuacct")}
    group = SessionGroup(Hierarchy(1, folders), "g")
    for folder in group.folders.values():
        folder.mkdir(parents=True)
    memory = group.folders["memory"]
    (group.folders["cpuacct"] / "cpuacct.usage").write_text("2500000000\n")
    (memory / "memory.max_usage_in_bytes").write_text("4096\n")
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert group.usage() == cgroup.Usage(2.5, 4096, 2)
    # a file missing, empty or garbled counts 0, never an error
    for text in (None, "", "lots\n", "oom_kill many\n"):
        for path in (memory / "memory.max_usage_in_bytes", memory / "memory.oom_control"):
            path.unlink(missing_ok=True)
            if text is not None:
                path.write_text(text)
        assert group.usage().peak_bytes == 0 and group.usage().oom_kills == 0


def test_a_group_whose_processes_outlive_sigkill_is_reported(monkeypatch, tmp_path, caplog):
    group = SessionGroup(Hierarchy(2, {"unified": tmp_path}), "g")
    monkeypatch.setattr(SessionGroup, "pids", lambda self: [2**22 + 1])  # (never goes)
    assert group.kill(timeout_s=0.0) is False
    with caplog.at_level("WARNING"):
        group.remove()
    assert "outlived SIGKILL" in caplog.text


def test_hierarchies_are_found_from_any_mount_root_and_odd_lines_are_passed_over(tmp_path):
    # a container: the cgroup mounts' roots are the container's own group
    mounts = (
        "bad line\n"
        "1 2 3 4\n"
        "a b c - d\n"  # (a separator, too little either side)
        "1 2 3 4 - cgroup2 cgroup2 rw\n"
        "1 2 3 / /p - cgroup\n"
        "1 2 3 / /q - cgroup x\n"
        "32 31 0:29 /docker/c1 /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
        "35 31 0:32 /docker/c1 /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "36 31 0:33 /docker/c1 /sys/fs/cgroup/blkio rw - cgroup cgroup rw,blkio\n"
        "39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
    )
    groups = (
        "12:name=systemd:/a:b\n"  # (a named hierarchy, a colon in its path)
        "9:blkio:/docker/c1\n8:pids:/docker/c1\n4:memory:/docker/c1/w\n2:cpu,cpuacct:/docker/c1\n"
    )
    found = find_hierarchy(mounts, groups)
    assert found is not None and found.limits_io
    assert found.folders == {
        "memory": Path("/sys/fs/cgroup/memory/w/speceyes-sandbox"),
        "pids": Path("/sys/fs/cgroup/pids/docker/c1/speceyes-sandbox"),
        "cpu": Path("/sys/fs/cgroup/cpu,cpuacct/speceyes-sandbox"),
        "cpuacct": Path("/sys/fs/cgroup/cpu,cpuacct/speceyes-sandbox"),
        "blkio": Path("/sys/fs/cgroup/blkio/speceyes-sandbox"),
    }
    # a controller missing from v1: the v2 mount is used, by the "0::" line only
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory pids io\n")
    mounts_v2 = (
        mounts.replace("rw,memory", "rw,hugetlb")
        + f"9 1 0:1 / {tmp_path} rw - cgroup2 cgroup2 rw\n"
    )
    hybrid = find_hierarchy(mounts_v2, "0::/\n3::/not/this\n" + groups)
    assert hybrid == Hierarchy(2, {"unified": tmp_path / "speceyes-sandbox"}, io=True)
    # the shortest whole line is read: a v2 mount of five fields and three after " - "
    assert find_hierarchy(f"1 2 3 / {tmp_path} - cgroup2 c rw\n", "0::/\n") == hybrid
    (tmp_path / "cgroup.subtree_control").unlink()  # (unreadable: no usable hierarchy)
    assert find_hierarchy(mounts_v2, "0::/\n" + groups) is None
    # no v2 mount: a "0::" line alone is no hierarchy
    assert find_hierarchy(mounts.replace("rw,memory", "rw,hugetlb"), "0::/\n" + groups) is None
    # blkio mounted but not among the worker's groups: no I/O limit, the rest as found
    partial = find_hierarchy(mounts, groups.replace("9:blkio:/docker/c1\n", ""))
    assert partial is not None and not partial.limits_io and "blkio" not in partial.folders
    # a group outside its mount's root is read from the mount point as it is
    outside = find_hierarchy(mounts, groups.replace("4:memory:/docker/c1/w", "4:memory:/else/w"))
    assert outside is not None
    assert outside.folders["memory"] == Path("/sys/fs/cgroup/memory/else/w/speceyes-sandbox")


def test_no_proc_files_means_no_hierarchy(monkeypatch):
    def unreadable(path):
        raise OSError("no /proc here")

    monkeypatch.setattr(cgroup, "_read", unreadable)
    assert find_hierarchy() is None


def test_asking_whether_a_process_lives_sends_it_nothing(monkeypatch):
    def refused(pid, sig):
        raise PermissionError(pid)

    def gone(path):
        raise OSError(path)

    child = subprocess.Popen(["sleep", "30"])
    try:
        assert cgroup.alive(child.pid)
        with pytest.raises(subprocess.TimeoutExpired):  # (no signal reached it)
            child.wait(timeout=0.3)
        with monkeypatch.context() as patch:  # another user's: the kill check is refused
            patch.setattr(cgroup.os, "kill", refused)
            assert cgroup.alive(child.pid)  # (/proc still tells)
            patch.setattr(cgroup, "_read", gone)
            assert not cgroup.alive(child.pid)  # gone between the two looks
    finally:
        child.kill()
        child.wait()


def test_the_machines_block_devices_are_named_major_minor():
    found = cgroup.block_devices()
    assert len(found) == len(list(Path("/sys/block").glob("*/dev")))
    assert all(re.fullmatch(r"\d+:\d+", device) for device in found)


def test_only_the_groups_of_dead_workers_are_swept(kernel, tmp_path):
    kernel.refused = {"memory.reclaim"}  # (a plain folder would keep the file written)
    dead = subprocess.Popen(["true"])
    dead.wait()  # (ended and reaped: no process has its pid now)
    parent = tmp_path / "speceyes-sandbox"
    names = [f"{dead.pid}-gone", f"{os.getpid()}-mine", "janitor-x", "plain"]
    for name in names:
        (parent / name).mkdir(parents=True)
    cgroup.sweep_stale(Hierarchy(2, {"unified": parent}))
    assert sorted(path.name for path in parent.iterdir()) == sorted(names[1:])
