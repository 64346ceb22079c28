"""How a guest process is started: the command line of each isolation.

``bubblewrap`` (the default) gives the guest a world of its own, and the guest is PID 1
in it, so no process inside runs without the guest's filter and limits:

- new PID, network, IPC, UTS and cgroup namespaces: no network (not even loopback), no
  other process, nothing to signal or trace; no ``/proc`` at all;
- a read-only root holding ``/usr``, the Python binary and its standard library (its
  ``site-packages`` and build configuration masked), the image packages the guest may
  import, the guest code; a minimal ``/dev`` (null, zero, random, urandom; no shm);
  writable only ``/mnt/data`` and ``/tmp``, both in the session's workspace;
- an empty environment but a few fixed variables.

Where the worker is root, bubblewrap runs privileged (no user namespace) and the guest
drops to the sandbox's own unprivileged uid (``setpriv``) before Python starts, with no
capabilities and no way to gain any: the guest is never root, nor mapped to it. A
worker that is not root runs bubblewrap in a user namespace of its own, where the
guest's uid maps to the worker's, and further user namespaces are disabled.

``gvisor`` (``common.sandbox.gvisor``) runs the same guest under gVisor's kernel.

``none`` runs the guest as a plain child process: limits, the seccomp filter and the
empty environment still apply, but it sees the host's files; only for an operator who
opted out by name.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Protocol

from common.sandbox.workspace import Workspace

GUEST = Path(__file__).resolve().parent / "guest"
GUEST_MOUNT = "/opt/speceyes"
PYTHON_MOUNT = "/opt/python"
SITE_MOUNT = "/opt/site"
WORK_MOUNT = "/mnt/data"
# what the guest may import besides the standard library (cv2 where installed)
GUEST_PACKAGES = ("PIL", "numpy", "cv2", "autopep8", "pycodestyle")
GUEST_ENV = {
    "LANG": "C.UTF-8",
    "HOME": WORK_MOUNT,
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONIOENCODING": "utf-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


class Launcher(Protocol):
    """Builds the command that starts one guest for a session's workspace."""

    name: str
    work_root: str  # /mnt/data as the guest sees it: fixed, or the host folder
    host_tasks: int  # tasks of the isolation itself in the session's control group
    tasks_counted: bool  # whether that group sees the guest's own tasks one for one

    def missing(self) -> str | None: ...

    def command(self, space: Workspace, setup: str) -> list[str]: ...

    def environment(self) -> dict[str, str]: ...

    def reap(self, keep: set[int]) -> None:
        """Reap what the isolation leaves this process to reap (after each execution),
        never the processes of ``keep`` (other sessions' launches, which they reap)."""


@dataclass(frozen=True)
class Runtime:
    """What of the host's Python the guest needs, and where the guest sees it."""

    binds: tuple[tuple[str, str], ...]  # (host path, guest path), read-only
    masks: tuple[str, ...]  # guest folders shown empty
    blanks: tuple[str, ...]  # guest files shown empty
    executable: str  # as the guest sees it
    library_path: str | None  # LD_LIBRARY_PATH for a shared libpython

    @classmethod
    def current(cls) -> Runtime:
        prefix = Path(sys.base_prefix)
        binary = f"python{VERSION}"
        if prefix == Path("/usr"):  # the system's Python: /usr is shown anyway
            return cls((), (), (), f"/usr/bin/{binary}", None)
        stdlib = prefix / "lib" / f"python{VERSION}"
        guest_stdlib = f"{PYTHON_MOUNT}/lib/python{VERSION}"
        binds = [
            (str(prefix / "bin" / binary), f"{PYTHON_MOUNT}/bin/{binary}"),
            (str(stdlib), guest_stdlib),
        ]
        libraries = sorted((prefix / "lib").glob(f"libpython{VERSION}*.so*"))
        binds += [(str(lib), f"{PYTHON_MOUNT}/lib/{lib.name}") for lib in libraries]
        # what names host paths: installed packages, the build's configuration
        masks = [f"{guest_stdlib}/{p.name}" for p in stdlib.glob("site-packages")]
        masks += [f"{guest_stdlib}/{p.name}" for p in stdlib.glob("config-*") if p.is_dir()]
        blanks = [f"{guest_stdlib}/{p.name}" for p in stdlib.glob("_sysconfigdata*.py")]
        return cls(
            tuple(binds),
            tuple(masks),
            tuple(blanks),
            f"{PYTHON_MOUNT}/bin/{binary}",
            f"{PYTHON_MOUNT}/lib" if libraries else None,
        )


def sandboxed_environment(runtime: Runtime) -> dict[str, str]:
    """The guest's whole environment where it sees the sandbox's mounts."""
    env = {**GUEST_ENV, "PYTHONPATH": SITE_MOUNT}
    if runtime.library_path:
        env["LD_LIBRARY_PATH"] = runtime.library_path
    return env


def guest_site() -> dict[str, str]:
    """The installed files of the packages the guest may import, and the shared
    libraries their wheels carry (``*.libs`` folders beside them), by name."""
    site: dict[str, str] = {}
    for package in GUEST_PACKAGES:
        spec = find_spec(package)
        if spec is None or spec.origin is None:
            continue
        origin = Path(spec.origin)
        source = origin.parent if spec.submodule_search_locations else origin
        site[source.name] = str(source)
        for libs in source.parent.glob("*.libs"):
            site[libs.name] = str(libs)
    return site


class Bubblewrap:
    """The guest in bubblewrap, as PID 1 of its namespaces (see the module's text)."""

    name = "bubblewrap"
    work_root = WORK_MOUNT
    host_tasks = 1  # bubblewrap's own process, outside the namespaces
    tasks_counted = True

    def __init__(self, executable: str, *, uid: int, gid: int) -> None:
        self.executable, self.uid, self.gid = executable, uid, gid
        self.privileged = os.geteuid() == 0
        self.runtime = Runtime.current()
        self.site = guest_site()

    def missing(self) -> str | None:
        """Why this cannot run here, or None."""
        if shutil.which(self.executable) is None:
            return (
                "Thyme runs model-written code and needs bubblewrap to isolate it, but "
                f"{self.executable!r} is not an executable here: install the Debian "
                "package `bubblewrap` (make setup does, as root), or set "
                "SPECEYES_ALLOW_UNSANDBOXED_CODE=true to run that code WITHOUT isolation "
                "(it could then read this machine's files and reach its network)"
            )
        if self.privileged and not Path("/usr/bin/setpriv").is_file():
            return "the sandbox drops root with /usr/bin/setpriv (Debian's util-linux): missing"
        return None

    def command(self, space: Workspace, setup: str) -> list[str]:
        argv = [
            self.executable,
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup",
            "--as-pid-1",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
        ]
        if self.privileged:  # caps only to drop them again, with the uid (setpriv, below)
            argv += ["--cap-drop", "ALL"]
            argv += [
                a for cap in ("SETUID", "SETGID", "SETPCAP") for a in ("--cap-add", f"CAP_{cap}")
            ]
        else:
            argv += ["--unshare-user", "--disable-userns", "--uid", "65534", "--gid", "65534"]
        argv += [
            "--ro-bind",
            "/usr",
            "/usr",
            "--symlink",
            "usr/lib",
            "/lib",
            "--symlink",
            "usr/lib64",
            "/lib64",
            "--symlink",
            "usr/bin",
            "/bin",
            "--perms",
            "0755",
            "--dir",
            "/dev",
        ]
        if Path("/usr/local").is_dir():  # the host's own installs: packages, our code
            argv += ["--tmpfs", "/usr/local", "--remount-ro", "/usr/local"]
        for name, source in space.devices.items():
            argv += ["--dev-bind", source, f"/dev/{name}"]
        targets = [t for _, t in self.runtime.binds] + [GUEST_MOUNT, f"{SITE_MOUNT}/-", WORK_MOUNT]
        for folder in _parents(targets):  # made here, or bubblewrap copies odd modes
            argv += ["--perms", "0755", "--dir", folder]
        for source, target in self.runtime.binds:
            argv += ["--ro-bind", source, target]
        for target in self.runtime.masks:
            argv += ["--tmpfs", target, "--remount-ro", target]
        for target in self.runtime.blanks:
            argv += ["--dev-bind", space.devices["null"], target]
        argv += ["--ro-bind", str(GUEST), GUEST_MOUNT]
        for name, source in self.site.items():
            argv += ["--ro-bind", source, f"{SITE_MOUNT}/{name}"]
        argv += ["--bind", str(space.data), WORK_MOUNT, "--bind", str(space.tmp), "/tmp"]
        for name, value in self.environment().items():
            argv += ["--setenv", name, value]
        argv += ["--remount-ro", "/"]
        if self.privileged:
            argv += [
                "/usr/bin/setpriv",
                f"--reuid={self.uid}",
                f"--regid={self.gid}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
                "--",
            ]
        return [*argv, self.runtime.executable, "-S", f"{GUEST_MOUNT}/harness.py", setup]

    def environment(self) -> dict[str, str]:
        return sandboxed_environment(self.runtime)

    def reap(self, keep: set[int]) -> None:
        """Nothing to reap: bubblewrap reaps its guest (killed first, see the session)."""


def _parents(paths: list[str]) -> list[str]:
    """Every folder above ``paths`` (not ``/``), parents first."""
    folders = {str(parent) for path in paths for parent in Path(path).parents}
    return sorted(folders - {"/"}, key=lambda folder: (folder.count("/"), folder))


class Unisolated:
    """The guest as a plain child process (``SPECEYES_ALLOW_UNSANDBOXED_CODE``)."""

    name = "none"
    host_tasks = 0
    tasks_counted = True

    def __init__(self) -> None:
        self.site = guest_site()
        self.work_root = ""  # set per session: the host folder itself

    def missing(self) -> str | None:
        return None

    def command(self, space: Workspace, setup: str) -> list[str]:
        parents = dict.fromkeys(str(Path(source).parent) for source in self.site.values())
        path = os.pathsep.join([str(GUEST), *parents])
        bootstrap = (
            f"import sys; sys.path[:0] = {path!r}.split({os.pathsep!r}); "
            "import runpy; runpy.run_path(sys.path[0] + '/harness.py', run_name='__main__')"
        )
        executable = str(Path(sys.base_prefix) / "bin" / f"python{VERSION}")
        return [executable, "-I", "-S", "-c", bootstrap, setup]

    def environment(self) -> dict[str, str]:
        return dict(GUEST_ENV)

    def reap(self, keep: set[int]) -> None:
        """Nothing to reap: the guest is this process's own child."""
