"""When a worker dies, its sandboxes die with it.

A guest arms its own parent-death signal, but where the worker is root the guest's
parent (bubblewrap, root without capabilities) may not signal a guest that runs as
another uid, so the kernel drops that signal. A worker that is SIGKILLed (or killed by
the OOM killer) mid-execution would then leave its guest running, its tmpfs mounted and
its control group in place.

So such a worker starts one janitor process, once: it waits on a pidfd for the worker
to end, however it ends, then kills what the worker's sessions left (their control
groups' processes, guests orphaned to init that run as the sandbox's uid), unmounts and
removes their folders, and exits. Sandboxes started later on the machine sweep the same
leftovers (``cgroup.sweep_stale``, ``workspace.sweep_stale``), should the janitor itself
have been killed.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

from common.sandbox import cgroup, workspace

_started: set[int] = set()  # the worker pids that have a janitor (fork-safe by pid)
_lock = threading.Lock()


def ensure_janitor(uid: int) -> None:
    """Start this process's janitor if it has none yet."""
    with _lock:
        if os.getpid() in _started:
            return
        command = (
            f"from common.sandbox.janitor import sweep_after; sweep_after({os.getpid()}, {uid})"
        )
        subprocess.Popen(
            [sys.executable, "-c", command],
            cwd=Path(__file__).resolve().parents[2],
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a signal to the worker's group does not reach it
            close_fds=True,
        )
        _started.add(os.getpid())


def sweep_after(worker: int, uid: int) -> None:
    """Wait for ``worker`` to end, then remove what its sandboxes left."""
    with contextlib.suppress(ProcessLookupError):  # (already gone: sweep at once)
        handle = os.pidfd_open(worker)
        select.select([handle], [], [])
    cgroup.sweep_stale(cgroup.find_hierarchy())
    kill_orphans(uid)
    workspace.sweep_stale()


def kill_orphans(uid: int) -> None:
    """SIGKILL processes of the sandbox's uid that no bubblewrap holds: guests and inits
    whose bubblewrap died with its worker. A live session's processes always have one
    above them (bubblewrap, then the init, then the guest, the last two of that uid)."""
    for status in Path("/proc").glob("[0-9]*/status"):
        fields = _status(status)
        if _uid(fields) == str(uid) and not _held_by_bubblewrap(fields, str(uid)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(status.parent.name), signal.SIGKILL)


def _held_by_bubblewrap(fields: dict[str, str], uid: str) -> bool:
    """Whether, going up through the parents of the sandbox's uid, the first of another
    uid is a bubblewrap."""
    for _ in range(8):  # (a session is three deep; a loop of pids cannot be)
        parent = _status(Path("/proc") / fields.get("PPid", "0").strip() / "status")
        if _uid(parent) != uid:
            return parent.get("Name", "").strip() == "bwrap"
        fields = parent
    return False


def _uid(fields: dict[str, str]) -> str | None:
    found = fields.get("Uid", "").split()
    return found[0] if found else None


def _status(path: Path) -> dict[str, str]:
    try:
        return dict(line.split(":", 1) for line in path.read_text().splitlines() if ":" in line)
    except OSError:
        return {}
