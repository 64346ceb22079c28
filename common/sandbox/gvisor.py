"""The guest under gVisor (``runsc``, Debian's ``runsc`` package): an optional, stronger
isolation (``SPECEYES_SANDBOX_ISOLATION=gvisor``).

gVisor puts a kernel of its own (the Sentry, in Go, itself under seccomp) between the
code and the host's: the code's system calls never reach the host kernel directly, so a
kernel bug reachable from the allowlist is no longer the host's. The guest sees the same
world as under bubblewrap (the same read-only mounts, ``/mnt/data`` and ``/tmp`` in the
session's workspace, no network), runs as the sandbox's uid, with the same harness,
seccomp filter (applied by the Sentry) and rlimits.

Each execution is ``runsc run`` of a container described by an OCI bundle written once
per session into the workspace's private folder (never into the guest's). runsc is
told to leave control groups alone: the session's group, which runsc joins before it
starts, counts the Sentry and its helpers (about 50 threads and 70 MB of their own, so
the group allows ``HOST_TASKS`` more tasks; the guest's own tasks are capped by its
RLIMIT_NPROC, which gVisor applies inside).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from common.sandbox.launch import (
    GUEST,
    GUEST_MOUNT,
    SITE_MOUNT,
    WORK_MOUNT,
    Runtime,
    guest_site,
    sandboxed_environment,
)
from common.sandbox.workspace import Workspace

HOST_TASKS = 256  # runsc, its gofer and the Sentry's threads


class GVisor:
    """The guest as the one process of a gVisor sandbox."""

    name = "gvisor"
    work_root = WORK_MOUNT
    host_tasks = HOST_TASKS
    tasks_counted = False  # (the group sees the Sentry's threads, not the guest's)

    def __init__(self, executable: str, *, uid: int) -> None:
        self.executable, self.uid = executable, uid
        self.runtime = Runtime.current()
        self.site = guest_site()

    def missing(self) -> str | None:
        if shutil.which(self.executable) is None:
            return (
                f"the gVisor sandbox needs {self.executable!r} (Debian's package `runsc`), "
                "which is not an executable here; or use the default isolation, "
                "SPECEYES_SANDBOX_ISOLATION=bubblewrap"
            )
        return None

    def command(self, space: Workspace, setup: str) -> list[str]:
        bundle = space.root / "gvisor"
        if not (bundle / "config.json").is_file():
            (bundle / "rootfs").mkdir(parents=True)
            (bundle / "state").mkdir()
        spec = self.spec(space, setup)
        (bundle / "config.json").write_text(json.dumps(spec))
        return [
            self.executable,
            f"--root={bundle / 'state'}",
            "--network=none",
            "--ignore-cgroups",
            "run",
            f"--bundle={bundle}",
            f"speceyes-{uuid.uuid4().hex}",
        ]

    def spec(self, space: Workspace, setup: str) -> dict[str, Any]:
        """The OCI runtime spec of one guest."""
        runtime = self.runtime
        binds = [("/usr", "/usr"), ("/usr/lib", "/lib"), ("/usr/lib64", "/lib64")]
        binds += [("/usr/bin", "/bin"), *runtime.binds, (str(GUEST), GUEST_MOUNT)]
        binds += [(source, f"{SITE_MOUNT}/{name}") for name, source in self.site.items()]
        mounts = [_bind(source, target, "ro") for source, target in binds]
        masks = [*runtime.masks, *(["/usr/local"] if Path("/usr/local").is_dir() else [])]
        mounts += [{"destination": t, "type": "tmpfs", "options": ["ro"]} for t in masks]
        mounts += [_bind("/dev/null", target, "ro") for target in runtime.blanks]
        mounts += [_bind(str(space.data), WORK_MOUNT, "rw"), _bind(str(space.tmp), "/tmp", "rw")]
        # no /proc: gVisor would show the guest its init's descriptors (stdout among them)
        mounts.append({"destination": "/proc", "type": "tmpfs", "options": ["ro", "size=4k"]})
        return {
            "ociVersion": "1.0.0",
            "process": {
                "user": {"uid": self.uid, "gid": self.uid},
                "args": [runtime.executable, "-S", f"{GUEST_MOUNT}/harness.py", setup],
                "env": [f"{name}={value}" for name, value in self.environment().items()],
                "cwd": "/",
                "noNewPrivileges": True,
                "capabilities": {},
            },
            "root": {"path": "rootfs", "readonly": True},
            "hostname": "sandbox",
            "mounts": mounts,
            "linux": {
                "namespaces": [{"type": kind} for kind in ("pid", "network", "ipc", "uts", "mount")]
            },
        }

    def environment(self) -> dict[str, str]:
        return sandboxed_environment(self.runtime)

    def reap(self, keep: set[int]) -> None:
        """Reap runsc's helpers that ended as this process's children: runsc starts its
        sandbox in a session of its own, so a worker that is PID 1 or a subreaper (a
        container's entrypoint) inherits them, and nothing else would wait for them.
        ``keep``: the ``runsc run`` processes sessions launched, which they reap (with
        trajectories run at once, another's may just have ended)."""
        for task in Path("/proc/self/task").iterdir():
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child in keep:
                    continue
                if _name_and_state(child) in (("exe", "Z"), ("runsc", "Z")):
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(child, os.WNOHANG)


def _bind(source: str, target: str, mode: str) -> dict[str, Any]:
    return {"destination": target, "type": "bind", "source": source, "options": ["rbind", mode]}


def _name_and_state(pid: int) -> tuple[str, str]:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "", ""
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    return name, stat[stat.rindex(")") + 2 :].split()[0]
