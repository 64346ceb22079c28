"""One control group per sandbox session: limits on all its processes together.

Per-process limits do not bound a sandbox: tmpfs and memfd pages are in no process's
address space, and RLIMIT_NPROC counts a uid's processes across the whole machine. A
control group counts what every process inside it uses, whatever it is:

- memory (its processes, their page cache, tmpfs and memfd pages) up to the limit, then
  the kernel's OOM killer ends them; no swap;
- tasks (processes and threads) up to ``threads``;
- CPU: at most one core's worth of time at any moment (a CFS quota);
- disk I/O, where the machine has the controller (v1 ``blkio``, v2 ``io``): bytes and
  operations a second on each block device, so that reads past the page cache
  (``O_DIRECT``, or files no one read lately) cannot crowd out the host's own;

and tells afterwards how much CPU they used, their peak memory and whether the OOM
killer ran. Both cgroup v1 (one hierarchy per controller: memory, pids, cpu, cpuacct)
and v2 (one hierarchy) are handled. The groups live under ``speceyes-sandbox``, beside
the worker's own group (v2) or below it (v1); creating them needs root. Where the
machine offers neither, ``SessionGroup.create`` returns None and the sandbox keeps its
per-process limits (the README states the gap).

Processes join a group by writing their own pid into its ``cgroup.procs`` before they
exec the sandbox (``join_command``), so nothing they start is ever outside it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PARENT = "speceyes-sandbox"
_V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")
_V1_OPTIONAL = ("blkio",)  # used where mounted: disk I/O
_V2_CONTROLLERS = ("memory", "pids", "cpu")
_V2_OPTIONAL = ("io",)
_CFS_PERIOD_US = 100_000


@dataclass(frozen=True)
class Usage:
    """What a group's processes used: CPU seconds, peak memory, OOM kills so far."""

    cpu_s: float
    peak_bytes: int
    oom_kills: int


@dataclass(frozen=True)
class Hierarchy:
    """Where sandbox groups can be made: ``folders`` by controller (v1), or one (v2)."""

    version: int
    folders: dict[str, Path]  # controller -> the folder under which groups are made
    io: bool = False  # v2: the io controller is on (v1: a "blkio" folder)

    @property
    def limits_io(self) -> bool:
        return self.io or "blkio" in self.folders


def find_hierarchy(mountinfo: str | None = None, own_groups: str | None = None) -> Hierarchy | None:
    """The hierarchy this process may make sandbox groups in (None: no usable one).

    Reads ``/proc/self/mountinfo`` and ``/proc/self/cgroup`` unless given their text.
    """
    try:
        mountinfo = mountinfo if mountinfo is not None else _read("/proc/self/mountinfo")
        own_groups = own_groups if own_groups is not None else _read("/proc/self/cgroup")
    except OSError:
        return None
    v1_mounts: dict[str, tuple[Path, str]] = {}  # controller -> (mount point, mount root)
    v2_mount: tuple[Path, str] | None = None
    for line in mountinfo.splitlines():
        # "ID PARENT MAJOR:MINOR ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE OPTIONS"
        before, separator, after = line.partition(" - ")
        fields, kinds = before.split(), after.split()
        if not separator or len(fields) < 5 or len(kinds) < 3:
            continue
        root, point = fields[3], Path(fields[4])
        fstype, options = kinds[0], kinds[2]
        if fstype == "cgroup2":
            v2_mount = (point, root)
        elif fstype == "cgroup":
            for option in options.split(","):
                if option in _V1_CONTROLLERS + _V1_OPTIONAL:
                    v1_mounts[option] = (point, root)
    own_v1: dict[str, str] = {}
    own_v2: str | None = None
    for line in own_groups.splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0" and controllers == "":
            own_v2 = path
        for controller in controllers.split(","):
            own_v1[controller] = path
    if all(c in v1_mounts and c in own_v1 for c in _V1_CONTROLLERS):
        used = [c for c in _V1_CONTROLLERS + _V1_OPTIONAL if c in v1_mounts and c in own_v1]
        folders = {c: _inside(*v1_mounts[c], own_v1[c]) / PARENT for c in used}
        return Hierarchy(1, folders)
    if v2_mount is not None and own_v2 is not None:
        return _v2_hierarchy(*v2_mount, own_v2)
    return None


def _v2_hierarchy(point: Path, root: str, own: str) -> Hierarchy | None:
    """v2 forbids processes in a group whose children have controllers, so the sandbox
    groups go beside the worker's own group, where the same controllers are on."""
    own_folder = _inside(point, root, own)
    parent = own_folder.parent if own_folder != point else point
    try:
        enabled = _read(parent / "cgroup.subtree_control").split()
    except OSError:
        return None
    if not all(c in enabled for c in _V2_CONTROLLERS):
        return None
    return Hierarchy(2, {"unified": parent / PARENT}, io="io" in enabled)


def _inside(point: Path, root: str, path: str) -> Path:
    relative = path[len(root) :] if root != "/" and path.startswith(root) else path
    return point / relative.lstrip("/")


class SessionGroup:
    """The group of one sandbox session, with its limits set."""

    def __init__(self, hierarchy: Hierarchy, name: str) -> None:
        self.hierarchy = hierarchy
        self.folders = {c: parent / name for c, parent in hierarchy.folders.items()}
        self._cpu_s_at_start = 0.0
        self._oom_kills_at_start = 0

    @classmethod
    def create(
        cls,
        hierarchy: Hierarchy | None,
        name: str,
        *,
        memory_bytes: int,
        tasks: int,
        io: IoLimit | None = None,
    ) -> SessionGroup | None:
        """A new group with these limits; None where the machine offers none. Where it
        does, a group that cannot be made is an error (``OSError``), never a session
        without one. ``io``: on every block device, where the controller is there."""
        if hierarchy is None:
            return None
        group = cls(hierarchy, name)
        try:
            group._make(memory_bytes, tasks)
            if io is not None:
                group._limit_io(io)
        except OSError:
            group.remove()
            raise
        return group

    def _make(self, memory_bytes: int, tasks: int) -> None:
        quota = f"{_CFS_PERIOD_US} {_CFS_PERIOD_US}"
        if self.hierarchy.version == 2:
            parent = self.hierarchy.folders["unified"]
            parent.mkdir(exist_ok=True)
            controllers = [*_V2_CONTROLLERS, *(_V2_OPTIONAL if self.hierarchy.io else ())]
            _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in controllers))
            folder = self.folders["unified"]
            folder.mkdir()
            _write(folder / "memory.max", str(memory_bytes))
            _write(folder / "memory.swap.max", "0", optional=True)
            _write(folder / "pids.max", str(tasks))
            _write(folder / "cpu.max", quota)
            return
        for folder in self.folders.values():
            folder.parent.mkdir(exist_ok=True)
            folder.mkdir()
        memory = self.folders["memory"]
        _write(memory / "memory.limit_in_bytes", str(memory_bytes))
        _write(memory / "memory.memsw.limit_in_bytes", str(memory_bytes), optional=True)
        _write(memory / "memory.swappiness", "0", optional=True)
        _write(self.folders["pids"] / "pids.max", str(tasks))
        _write(self.folders["cpu"] / "cpu.cfs_period_us", str(_CFS_PERIOD_US))
        _write(self.folders["cpu"] / "cpu.cfs_quota_us", str(_CFS_PERIOD_US))

    def _limit_io(self, io: IoLimit) -> None:
        """Throttle every block device of the machine (a device that refuses a rule, a
        virtual one, is left as it is); at least one must take it."""
        if not self.hierarchy.limits_io:
            return
        taken = 0
        for device in block_devices():
            if self.hierarchy.version == 2:
                rates = f"rbps={io.bytes_s} wbps={io.bytes_s} riops={io.ops_s} wiops={io.ops_s}"
                rule = f"{device} {rates}"
                taken += _try_write(self.folders["unified"] / "io.max", rule)
                continue
            folder = self.folders["blkio"]
            for kind, value in (("bps", io.bytes_s), ("iops", io.ops_s)):
                for direction in ("read", "write"):
                    path = folder / f"blkio.throttle.{direction}_{kind}_device"
                    taken += _try_write(path, f"{device} {value}")
        if not taken:
            log.warning("no block device took the sandbox's I/O limit: disk I/O is unlimited")

    @property
    def procs_files(self) -> list[Path]:
        """The files a process writes "0" into to join the group (every hierarchy)."""
        return [folder / "cgroup.procs" for folder in self.folders.values()]

    def join_command(self) -> list[str]:
        """A command prefix: the process joins this group, then execs the rest."""
        count = len(self.procs_files)
        joins = " && ".join(f'echo 0 > "${index + 1}"' for index in range(count))
        script = f'{joins} || exit 125; shift {count}; exec "$@"'
        return ["/bin/sh", "-c", script, "sh", *map(str, self.procs_files)]

    def pids(self) -> list[int]:
        found: set[int] = set()
        for path in self.procs_files:
            with contextlib.suppress(OSError):
                found.update(int(line) for line in _read(path).split())
        return sorted(found)

    def kill(self, timeout_s: float = 5.0) -> bool:
        """SIGKILL every process in the group until none is left; False if some are still
        there after ``timeout_s`` (a process stuck in the kernel)."""
        deadline = time.monotonic() + timeout_s
        while pids := self.pids():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)  # the kernel is tearing them down; nothing to wait on
        return True

    def usage(self) -> Usage:
        """What the group used since ``start_count``: CPU seconds, peak memory, OOM kills."""
        return Usage(
            self._cpu_s() - self._cpu_s_at_start,
            self._peak_bytes(),
            self._oom_kills() - self._oom_kills_at_start,
        )

    def start_count(self) -> None:
        """Count from now (one execution's use)."""
        with contextlib.suppress(OSError):
            if self.hierarchy.version == 2:
                _write(self.folders["unified"] / "memory.peak", "0")
            else:
                _write(self.folders["memory"] / "memory.max_usage_in_bytes", "0")
        self._cpu_s_at_start = self._cpu_s()
        self._oom_kills_at_start = self._oom_kills()

    def _cpu_s(self) -> float:
        if self.hierarchy.version == 2:
            return _stat(self.folders["unified"] / "cpu.stat", "usage_usec") / 1e6
        return _number(self.folders["cpuacct"] / "cpuacct.usage") / 1e9

    def _peak_bytes(self) -> int:
        if self.hierarchy.version == 2:
            return _number(self.folders["unified"] / "memory.peak")
        return _number(self.folders["memory"] / "memory.max_usage_in_bytes")

    def _oom_kills(self) -> int:
        if self.hierarchy.version == 2:
            return _stat(self.folders["unified"] / "memory.events", "oom_kill")
        return _stat(self.folders["memory"] / "memory.oom_control", "oom_kill")

    def remove(self) -> None:
        """Kill what is left, give back the memory still charged to the group (page cache
        of files its processes read), so that the kernel can free the group at once
        rather than keep it dying while those pages live, and remove it (its parent
        stays, for other sessions)."""
        if not self.kill():
            log.warning("sandbox processes in %s outlived SIGKILL", self.folders)
        with contextlib.suppress(OSError):
            if self.hierarchy.version == 2:
                _write(self.folders["unified"] / "memory.reclaim", str(1 << 40))
            else:
                _write(self.folders["memory"] / "memory.force_empty", "0")
        for folder in self.folders.values():
            with contextlib.suppress(OSError):
                folder.rmdir()


def sweep_stale(hierarchy: Hierarchy | None) -> None:
    """Remove the groups of sessions whose worker died without closing them (a group
    is named ``<worker pid>-<id>``)."""
    if hierarchy is None:
        return
    for parent in hierarchy.folders.values():
        for folder in parent.glob("*-*") if parent.is_dir() else ():
            owner = folder.name.split("-", 1)[0]
            if owner.isdigit() and not alive(int(owner)):
                SessionGroup(hierarchy, folder.name).remove()


@dataclass(frozen=True)
class IoLimit:
    """Disk I/O of one group: ``bytes_s`` and ``ops_s`` a second, each way, per device."""

    bytes_s: int
    ops_s: int


def block_devices() -> list[str]:
    """The machine's block devices as ``major:minor`` (``/sys/block``)."""
    found = []
    for entry in sorted(Path("/sys/block").glob("*/dev")):
        with contextlib.suppress(OSError):
            found.append(_read(entry).strip())
    return found


def alive(pid: int) -> bool:
    """Whether a process ``pid`` runs (a worker that named a group or folder). A zombie
    does not: a worker that was killed has ended before its parent reaps it, and its
    janitor, woken by its end, must not wait for the reaping."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = _read(f"/proc/{pid}/stat")
    except OSError:  # (gone since)
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]  # (the state follows the name)


def _read(path: str | Path) -> str:
    with open(path) as handle:
        return handle.read()


def _write(path: Path, value: str, *, optional: bool = False) -> None:
    try:
        with open(path, "w") as handle:
            handle.write(value)
    except OSError:
        if not optional:
            raise


def _try_write(path: Path, value: str) -> int:
    """1 where the kernel took ``value``, 0 where it refused it."""
    try:
        _write(path, value)
    except OSError:
        return 0
    return 1


def _number(path: Path) -> int:
    try:
        return int(_read(path).split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _stat(path: Path, key: str) -> int:
    """A ``key value`` line's value (cpu.stat, memory.events, memory.oom_control)."""
    try:
        for line in _read(path).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0
