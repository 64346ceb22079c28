"""A session: one trajectory's workspace, control group and guest processes (a spare
one started ahead), and each execution run in it, read back and classified."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import RetryableError
from common.sandbox import cgroup, janitor, workspace
from common.sandbox.channel import (
    STATUS_BYTES,
    BadReport,
    collect,
    decode_text,
    parse,
    split_status,
)
from common.sandbox.execution import (
    LAUNCHED,
    LAUNCHED_LOCK,
    START_S,
    STDERR_TAIL,
    Ended,
    Execution,
    Stop,
    children_of,
    exit_code,
    has_ended,
    launched,
    wait_for,
)

if TYPE_CHECKING:
    from common.sandbox import Sandbox

log = logging.getLogger(__name__)


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
        with LAUNCHED_LOCK:  # (registered before another session's reap can look)
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
            LAUNCHED.add(process.pid)
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
        status = wait_for(process, time.perf_counter() + 5)
        if status is None:  # it closed its pipes and ran on
            overrun = "timeout"
            self._kill(process)
            status = wait_for(process, time.perf_counter() + 5)
        self.sandbox.launcher.reap(launched())
        seconds = time.perf_counter() - started
        cpu_s, peak, oom_kills = self._usage(status)
        tail = decode_text(err[-4 * STDERR_TAIL :])[-STDERR_TAIL:]
        ended = Ended(seconds, cpu_s, peak)
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
            launcher = exit_code(status[0] if status else 0)
            said = f"ended without its init's report ({launcher.describe()})"
            return ended(None, "killed", f"{said}; {tail}")
        code = exit_code(guest_status)  # exact: the init reaped it
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
        inside = set(children_of(process.pid)) | set(self.group.pids() if self.group else ())
        inside.discard(process.pid)
        for pid in inside:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not inside or not has_ended(process, time.perf_counter() + 1):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        if self.group is not None:
            self.group.kill()  # anything left

    def close(self) -> None:
        if self._spare is not None:
            self._kill(self._spare)
            wait_for(self._spare, time.perf_counter() + 5)
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
