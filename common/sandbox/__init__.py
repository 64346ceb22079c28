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

Here: ``Sandbox`` (the isolation and limits chosen, checked at start-up); a session and
each execution in it: ``session``; how an execution ended: ``execution``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, Literal

from common.config import SandboxSettings, Settings
from common.errors import ConfigurationError
from common.sandbox import cgroup, janitor, workspace
from common.sandbox.channel import Grid, ReportLimits
from common.sandbox.execution import Execution, Stop, launched
from common.sandbox.gvisor import GVisor
from common.sandbox.launch import WORK_MOUNT, Bubblewrap, Launcher, Unisolated
from common.sandbox.session import SandboxSession

log = logging.getLogger(__name__)

Isolation = Literal["bubblewrap", "gvisor", "none"]

__all__ = [
    "QWEN25_GRID",
    "Execution",
    "Isolation",
    "Sandbox",
    "SandboxSession",
    "SandboxUnavailable",
    "Stop",
    "header_bytes",
    "launched",
    "probe_request",
    "require_code_sandbox",
    "view_request",
    "worker_bytes",
]


class SandboxUnavailable(ConfigurationError):
    """The sandbox cannot run here (no bubblewrap, or the kernel refuses namespaces)."""


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
                # the group counts CPU exactly from the request: the kernel's RLIMIT_CPU
                # is then a backstop, past the warm-up and at twice the allowance. (gVisor's
                # kernel counts a task's time in the application, runnable or running: on
                # a busy host it runs ahead of the group; CI saw it kill a loop at 1.89 of
                # its 2 CPU-s.)
                "cpu_backstop_s": limits.cpu_s * 2 if grouped else limits.cpu_s,
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
