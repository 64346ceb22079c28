"""One execution: how it ended (``Execution``, its ``Stop``), the guest's exit code, and
the launcher processes this worker started and has yet to reap."""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

from common.sandbox.channel import (
    GuestReport,
)

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class Ended:
    seconds: float
    cpu_s: float
    peak_bytes: int

    def __call__(self, report: GuestReport | None, stop: Stop | None, detail: str) -> Execution:
        return Execution(report, stop, detail, self.seconds, self.cpu_s, self.peak_bytes)


@dataclass(frozen=True)
class ExitCode:
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


def exit_code(status: int) -> ExitCode:
    """A wait status (``channel.split_status`` takes only those a process can end with)
    as an exit code or a signal. (bubblewrap itself exits 128 + N both when its child
    exits so and when signal N kills it: only the init's record tells them apart.)"""
    code = os.waitstatus_to_exitcode(status)
    return ExitCode(code, -code) if code < 0 else ExitCode(code, 0)


def wait_for(process: subprocess.Popen[bytes], deadline: float) -> tuple[int, Any] | None:
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
    with LAUNCHED_LOCK:
        LAUNCHED.discard(process.pid)
    process.returncode = os.waitstatus_to_exitcode(status)
    return status, usage


# the launcher processes of this process's sessions not reaped yet, which a launcher's
# reap (of what runsc leaves) must leave to their own session
LAUNCHED: set[int] = set()
LAUNCHED_LOCK = threading.Lock()


def launched() -> set[int]:
    with LAUNCHED_LOCK:
        return set(LAUNCHED)


def has_ended(process: subprocess.Popen[bytes], deadline: float) -> bool:
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


def children_of(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(child) for child in handle.read().split()]
    except (OSError, ValueError):
        return []
