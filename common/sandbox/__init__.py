"""Model-written code, run where it cannot hurt the service.

Thyme writes Python from questions and images that API users send, and our workers sit
next to the job store's credentials, so every execution is contained by layers that
each hold on their own:

1. **Isolation** (``launch``): a fresh process per execution, in its own namespaces,
   seeing a read-only root and nothing of ours; it is PID 1 there, the only process.
   Where the worker is root the code runs as an unprivileged uid of our own
   (``sandbox_uid``), never as root or mapped to it.
2. **Its own filter and limits** (``guest/``): before it reads any code the guest
   process puts a seccomp allowlist on itself (``guest/seccomp.py``) and lowers its
   rlimits (CPU seconds, address space, open files, file size).
3. **Limits on the sandbox as a whole** (``cgroup``): memory (tmpfs and memfd
   included), tasks and CPU for all its processes together, in a control group per
   session; its writable places are one size- and inode-limited tmpfs
   (``workspace``), nosuid, nodev and noexec, in a folder only its owner reaches.
4. **A host that trusts nothing it gets back** (``channel``): output read under caps and
   the wall clock, the report checked field by field, images taken as raw pixels of
   a checked size (no file of the guest's is opened, no format decoded), every text
   cleaned. Whatever the guest does, the worker records an observation and goes on.

Each session (one trajectory) keeps a spare guest process started ahead, so that its
start-up overlaps the model's generation; each execution still gets a process of its
own. ``isolation="gvisor"`` runs the guest under gVisor instead of bubblewrap;
``isolation="none"`` (``SPECEYES_ALLOW_UNSANDBOXED_CODE``) drops layer 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import select
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from common.config import SandboxSettings, Settings
from common.errors import ConfigurationError, RetryableError
from common.sandbox import cgroup, janitor, workspace
from common.sandbox.channel import (
    STATUS_BYTES,
    BadReport,
    Grid,
    GuestReport,
    ReportLimits,
    collect,
    decode_text,
    parse,
    split_status,
)
from common.sandbox.gvisor import GVisor
from common.sandbox.launch import WORK_MOUNT, Bubblewrap, Launcher, Unisolated

log = logging.getLogger(__name__)

Isolation = Literal["bubblewrap", "gvisor", "none"]
Stop = Literal[
    "timeout",
    "output_limit",
    "memory_limit",
    "cpu_limit",
    "disk_limit",
    "killed",
    "no_result",
    "bad_report",
]
STDERR_TAIL = 2000  # characters of what the guest printed to stderr kept for the record
START_S = 30.0  # the longest a guest may take to be ready for its code (its clock then starts)


class SandboxUnavailable(ConfigurationError):
    """The sandbox cannot run here (no bubblewrap, or the kernel refuses namespaces)."""


@dataclass(frozen=True)
class Execution:
    """How one run ended: ``report`` is what the guest handed back, or None with
    ``stop`` saying why (a limit, a signal, no report, a broken report); ``detail`` says
    it for people. ``cpu_s`` and ``peak_bytes`` are what the sandbox used."""

    report: GuestReport | None
    stop: Stop | None
    detail: str
    seconds: float
    cpu_s: float = 0.0
    peak_bytes: int = 0


class Sandbox:
    """Where code runs: the isolation, the limits, the machine's control groups."""

    def __init__(
        self, limits: SandboxSettings | None = None, *, isolation: Isolation | None = None
    ) -> None:
        """A sandbox as ``limits`` say (the sandbox's settings: limits, isolation, uid,
        executables); ``isolation`` overrides theirs."""
        self.limits = limits = limits or SandboxSettings()
        self.isolation = isolation or limits.effective_isolation
        self.uid = limits.uid
        self.launcher = _launcher(
            self.isolation, bwrap=limits.bwrap, runsc=limits.runsc, uid=self.uid
        )
        self.hierarchy = cgroup.find_hierarchy() if os.geteuid() == 0 else None
        cgroup.sweep_stale(self.hierarchy)  # what workers that died left
        if os.geteuid() == 0:
            janitor.kill_orphans(self.uid)
        workspace.sweep_stale()

    def check(self) -> None:
        """Refuse (``SandboxUnavailable``, one clear message) unless a trivial program
        runs and reports back."""
        missing = self.launcher.missing()
        if missing is not None:
            raise SandboxUnavailable(missing)
        with self.session(spare=False) as session:
            run = session.run({"code": "print('ok')", **probe_request(session)})
        if run.report is None or run.report.text != "ok":
            raise SandboxUnavailable(
                f"the code sandbox does not work here ({run.stop or 'wrong report'}: "
                f"{run.detail or run.report}); on hosts that restrict user namespaces, "
                "allow them for bwrap (e.g. sysctl kernel.unprivileged_userns_clone=1)"
            )

    def session(self, *, spare: bool = True) -> SandboxSession:
        """A workspace for one trajectory, with a guest process already starting."""
        return SandboxSession(self, spare=spare)

    def guest_setup(self, workdir: str, *, counted: bool, grouped: bool, host_devices: bool) -> str:
        """The guest's folder and own limits, as its one argument (``counted``: a control
        group counts its tasks, so RLIMIT_NPROC, which counts the uid's everywhere, is
        off; ``grouped``: a control group counts its CPU exactly; ``host_devices``: the
        device nodes it sees are the host's, so it may not set file times)."""
        limits = self.limits
        return json.dumps(
            {
                "workdir": workdir,
                "cpu_s": limits.cpu_s,
                # the group counts CPU exactly from the request: the kernel's RLIMIT_CPU
                # is then a backstop, not counting the warm-up before it
                "cpu_after_warm_up": grouped,
                # with a group the memory of everything it runs is counted there; the
                # address space only stops absurd reservations (libraries reserve more
                # than they touch)
                "memory_bytes": (limits.memory_mb << 20) * (4 if counted else 1),
                "open_files": limits.open_files,
                "file_bytes": limits.file_mb << 20,
                "processes": None if counted else limits.threads,
                "printed_chars": limits.output_bytes // 2,
                "text_chars": limits.text_chars,
                "wall_s": limits.wall_s,
                "images": limits.max_images,
                "image_pixels": limits.image_pixels,
                "host_devices": host_devices,
            }
        )

    def report_limits(self, view: dict[str, Any] | None = None) -> ReportLimits:
        """What a report may hold; with a request's ``view`` (the model's grid and the
        pixels the trajectory may still be shown), images on that grid within that."""
        limits = self.limits
        grid = None if view is None else Grid(**{k: view[k] for k in Grid.__dataclass_fields__})
        return ReportLimits(
            header_bytes=header_bytes(limits),
            text_chars=limits.text_chars,
            images=limits.max_images,
            pixels=limits.image_pixels
            if view is None
            else min(view["pixels"], limits.image_pixels),
            shown_chars=limits.text_chars,
            grid=grid,
        )

    def __repr__(self) -> str:
        return f"Sandbox(isolation={self.isolation!r}, limits={self.limits})"


class SandboxSession:
    """One trajectory's workspace (``folder`` on the host is ``/mnt/data`` inside), its
    control group, and its next guest process, started ahead."""

    def __init__(self, sandbox: Sandbox, *, spare: bool = True) -> None:
        self.sandbox = sandbox
        limits = sandbox.limits
        if os.geteuid() == 0:  # (a guest that is not root cannot be signalled by its parent)
            janitor.ensure_janitor(sandbox.uid)
        self.workspace = workspace.Workspace(
            uid=sandbox.uid,
            gid=sandbox.uid,
            disk_bytes=limits.disk_mb << 20,
            files=limits.files,
        )
        name = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        launcher = sandbox.launcher
        try:  # (a machine with groups gets one per session, or no session: never less)
            self.group = cgroup.SessionGroup.create(
                sandbox.hierarchy,
                name,
                memory_bytes=limits.memory_mb << 20,
                tasks=limits.threads + launcher.host_tasks,
                io=cgroup.IoLimit(limits.io_mb_s * 1_000_000, limits.io_ops_s),
            )
        except OSError as exc:
            self.workspace.remove()
            raise RetryableError(
                f"cannot make the code sandbox's control group: {exc}", code="sandbox_busy"
            ) from None
        self.keeps_spare = spare
        self._spare: subprocess.Popen[bytes] | None = None
        try:
            self._spare = self._start() if spare else None
        except BaseException:
            self.close()
            raise

    @property
    def folder(self) -> Path:
        return self.workspace.data

    @property
    def root(self) -> str:
        """The folder as the code sees it."""
        return self.sandbox.launcher.work_root or str(self.workspace.data)

    def inside(self, relative: str) -> str:
        """A path in the folder, as the code sees it."""
        return f"{self.root}/{relative}"

    def run(self, request: dict[str, Any]) -> Execution:
        over = self.workspace.over_budget()
        if over is not None:
            return Execution(None, "disk_limit", over, 0.0)
        process = self._spare or self._start()
        self._spare = None
        try:
            return self._finish(process, request)
        finally:
            if self.keeps_spare:
                self._spare = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        launcher = self.sandbox.launcher
        counted = self.group is not None and launcher.tasks_counted
        # bubblewrap shows the workspace's nodes, the host's where it could make none;
        # gVisor shows its own; unisolated code sees the host's /dev as it is
        host_devices = launcher.name == "none" or (
            launcher.name == "bubblewrap" and not self.workspace.own_devices
        )
        setup = self.sandbox.guest_setup(
            self.root, counted=counted, grouped=self.group is not None, host_devices=host_devices
        )
        command = launcher.command(self.workspace, setup)
        if self.group is not None:
            command = [*self.group.join_command(), *command]
        with _LAUNCHED_LOCK:  # (registered before another session's reap can look)
            process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=launcher.environment() if launcher.name == "none" else {},
                cwd=self.workspace.data,
                start_new_session=True,
                close_fds=True,
            )
            _LAUNCHED.add(process.pid)
        return process

    def _finish(self, process: subprocess.Popen[bytes], request: dict[str, Any]) -> Execution:
        """Hand ``request`` to a started guest and read how it ends. Its stdin stays open
        until then: the guest's init ends the sandbox when it hangs up (this process is
        gone)."""
        limits = self.sandbox.limits
        report_limits = self.sandbox.report_limits(request.get("view"))
        if self.group is not None:
            self.group.start_count()
        started = time.perf_counter()
        # the wall clock counts from the guest being ready (``collect``); until then a
        # start of up to START_S (a cold one, on a busy machine) is waited for
        deadline = started + limits.wall_s + START_S
        assert process.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # it died starting: its stderr says why
            process.stdin.write(json.dumps(request).encode() + b"\n")
            process.stdin.flush()
        group = self.group
        out, err, overrun = collect(
            process,
            deadline,
            stdout_cap=report_limits.header_bytes + 3 * report_limits.pixels + STATUS_BYTES,
            stderr_cap=limits.output_bytes,
            # the group counts CPU exactly, where RLIMIT_CPU samples it at each tick
            over_cpu=lambda: group is not None and group.usage().cpu_s > limits.cpu_s,
            wall_s=limits.wall_s,
        )
        for stream in (process.stdin, process.stdout, process.stderr):
            assert stream is not None
            with contextlib.suppress(BrokenPipeError):
                stream.close()
        if overrun is not None:
            self._kill(process)
        # (the pipes close when the init ends: its launcher ends right after)
        status = _wait(process, time.perf_counter() + 5)
        if status is None:  # it closed its pipes and ran on
            overrun = "timeout"
            self._kill(process)
            status = _wait(process, time.perf_counter() + 5)
        self.sandbox.launcher.reap(launched())
        seconds = time.perf_counter() - started
        cpu_s, peak, oom_kills = self._usage(status)
        tail = decode_text(err[-4 * STDERR_TAIL :])[-STDERR_TAIL:]
        ended = _Ended(seconds, cpu_s, peak)
        if overrun == "timeout":
            return ended(None, "timeout", f"killed after {limits.wall_s:g} s (wall clock)")
        if overrun == "output_limit":
            return ended(None, "output_limit", "killed: it wrote more than its output allows")
        if overrun == "cpu_limit":
            return ended(None, "cpu_limit", f"killed: over the CPU time limit of {limits.cpu_s} s")
        if oom_kills:
            said = f"killed: over the memory limit of {limits.memory_mb} MiB"
            return ended(None, "memory_limit", f"{said} (its processes and files together)")
        guest_status = split_status(out)
        if guest_status is None:  # its init ended before it could tell (killed)
            launcher = _exit_code(status[0] if status else 0)
            said = f"ended without its init's report ({launcher.describe()})"
            return ended(None, "killed", f"{said}; {tail}")
        code = _exit_code(guest_status)  # exact: the init reaped it
        cpu_signals = (signal.SIGKILL, signal.SIGXCPU)
        if code.signal in cpu_signals and cpu_s >= limits.cpu_s - 0.1:
            return ended(None, "cpu_limit", f"killed: over the CPU time limit of {limits.cpu_s} s")
        if code.signal:
            return ended(None, "killed", f"killed by {code.describe()}; {tail}")
        try:
            report = parse(out, report_limits)
        except BadReport as exc:
            stop: Stop = "no_result" if not out else "bad_report"
            return ended(None, stop, f"{code.describe()}: {exc}; {tail}")
        return ended(report, None, tail)

    def _usage(self, status: tuple[int, Any] | None) -> tuple[float, int, int]:
        """This execution's CPU seconds, peak memory and OOM kills: the guest's own as its
        parent reaped it, and its group's (the files in its tmpfs, gVisor's kernel)."""
        cpu_s = status[1].ru_utime + status[1].ru_stime if status else 0.0
        peak = status[1].ru_maxrss << 10 if status else 0
        if self.group is None:
            return cpu_s, peak, 0
        usage = self.group.usage()
        return max(cpu_s, usage.cpu_s), usage.peak_bytes, usage.oom_kills

    def _kill(self, process: subprocess.Popen[bytes]) -> None:
        """Kill every process of this sandbox, the guest first: its parent (bubblewrap,
        runsc) then reaps it and ends. (Killed together, the guest could pass to a worker
        that is PID 1 or a subreaper, which would never reap it.) Under bubblewrap the
        guest is PID 1 of its namespace: the kernel ends the namespace with it."""
        inside = set(_children(process.pid)) | set(self.group.pids() if self.group else ())
        inside.discard(process.pid)
        for pid in inside:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not inside or not _ended(process, time.perf_counter() + 1):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        if self.group is not None:
            self.group.kill()  # anything left

    def close(self) -> None:
        if self._spare is not None:
            self._kill(self._spare)
            _wait(self._spare, time.perf_counter() + 5)
            for stream in (self._spare.stdin, self._spare.stdout, self._spare.stderr):
                if stream is not None:
                    stream.close()
            self._spare = None
            self.sandbox.launcher.reap(launched())
        if self.group is not None:
            self.group.remove()
        self.workspace.remove()

    def __enter__(self) -> SandboxSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class _Ended:
    seconds: float
    cpu_s: float
    peak_bytes: int

    def __call__(self, report: GuestReport | None, stop: Stop | None, detail: str) -> Execution:
        return Execution(report, stop, detail, self.seconds, self.cpu_s, self.peak_bytes)


@dataclass(frozen=True)
class _ExitCode:
    code: int
    signal: int  # 0: it exited

    def describe(self) -> str:
        if not self.signal:
            return f"exit {self.code}"
        try:
            name = signal.Signals(self.signal).name
        except ValueError:
            return f"signal {self.signal}"
        if self.signal == signal.SIGSYS:
            name += " (a system call the sandbox forbids)"
        return name


def _exit_code(status: int) -> _ExitCode:
    """A wait status (``channel.split_status`` takes only those a process can end with)
    as an exit code or a signal. (bubblewrap itself exits 128 + N both when its child
    exits so and when signal N kills it: only the init's record tells them apart.)"""
    code = os.waitstatus_to_exitcode(status)
    return _ExitCode(code, -code) if code < 0 else _ExitCode(code, 0)


def _wait(process: subprocess.Popen[bytes], deadline: float) -> tuple[int, Any] | None:
    """Reap ``process`` by the deadline: (its wait status, its resource usage, which
    includes the guest that bubblewrap reaped), or None if it is still running."""
    if process.returncode is not None:
        return None
    handle = os.pidfd_open(process.pid)
    try:
        ready, _, _ = select.select([handle], [], [], max(0.0, deadline - time.perf_counter()))
        if not ready:
            return None
        _, status, usage = os.wait4(process.pid, 0)
    finally:
        os.close(handle)
    with _LAUNCHED_LOCK:
        _LAUNCHED.discard(process.pid)
    process.returncode = os.waitstatus_to_exitcode(status)
    return status, usage


# the launcher processes of this process's sessions not reaped yet, which a launcher's
# reap (of what runsc leaves) must leave to their own session
_LAUNCHED: set[int] = set()
_LAUNCHED_LOCK = threading.Lock()


def launched() -> set[int]:
    with _LAUNCHED_LOCK:
        return set(_LAUNCHED)


def _ended(process: subprocess.Popen[bytes], deadline: float) -> bool:
    """Whether ``process`` has ended by the deadline (it is not reaped here)."""
    if process.returncode is not None:
        return True
    try:
        handle = os.pidfd_open(process.pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([handle], [], [], max(0.0, deadline - time.perf_counter()))
        return bool(ready)
    finally:
        os.close(handle)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(child) for child in handle.read().split()]
    except (OSError, ValueError):
        return []


def _launcher(isolation: Isolation, *, bwrap: str, runsc: str, uid: int) -> Launcher:
    if isolation == "none":
        return Unisolated()
    if isolation == "gvisor":
        return GVisor(runsc, uid=uid)
    return Bubblewrap(bwrap, uid=uid, gid=uid)


def require_code_sandbox(settings: Settings) -> None:
    """Where this process will run Thyme's trajectories: refuse to start unless the
    sandbox works (or the operator opted out, which is logged as the risk it is)."""
    if settings.agent.kind != "thyme":
        return
    sandbox = Sandbox(settings.agent.sandbox)
    if sandbox.isolation == "none":
        log.warning(
            "SPECEYES_ALLOW_UNSANDBOXED_CODE is set: Thyme's model-written code runs "
            "WITHOUT isolation and can read this machine's files and reach its network"
        )
    sandbox.check()


def probe_request(session: SandboxSession) -> dict[str, Any]:
    """A request with every field but the code (for checks, tests and benchmarks): the
    images it hands back on Qwen2.5-VL's grid, as much as one execution may hold."""
    return {
        "image_path": session.inside("image.jpg"),
        "output_dir": session.inside("out/"),
        "model_output_dir": f"{WORK_MOUNT}/out/",
        "refused": [],
        "min_crop_side": 1,
        "view": view_request(QWEN25_GRID, session.sandbox.limits.view_tokens),
    }


# Qwen2.5-VL's (the reference's) grid: 28 px a token side, 4 to 16,384 tokens an image,
# an aspect ratio of at most 200 (transformers' and our uploads' limit)
QWEN25_GRID = Grid(factor=28, min_pixels=4 * 28 * 28, max_pixels=16384 * 28 * 28, max_aspect=200)


def header_bytes(limits: SandboxSettings) -> int:
    """The most a report's JSON header may take: its three texts of ``text_chars`` each,
    at 6 bytes a character escaped, and room for its images and notes."""
    return 18 * limits.text_chars + (64 << 10)


def worker_bytes(limits: SandboxSettings, steps: int = 6) -> int:
    """The most one trajectory of ``steps`` executions makes the worker hold at once,
    whatever the code does (docs/sandbox.md): the report's header as read and as parsed
    (JSON objects take up to ~25 times their text), stderr (``output_bytes``), the
    images it may be shown (``view_tokens`` on the grid: 3 bytes a pixel as they arrive,
    4 as Pillow holds them, RGB being stored as RGBX, which the conversation keeps) and
    each step's texts (two of ``text_chars``, 4 bytes a character at most)."""
    view_pixels = limits.view_tokens * QWEN25_GRID.factor**2
    header = (1 + 32) * header_bytes(limits)
    texts = steps * 8 * limits.text_chars
    return header + limits.output_bytes + (3 + 4) * view_pixels + texts


def view_request(grid: Grid, tokens: int) -> dict[str, Any]:
    """A request's ``view``: the model's ``grid``, and ``tokens`` visual tokens at most
    for the images one execution hands back."""
    return {**dataclasses.asdict(grid), "pixels": tokens * grid.factor**2}
