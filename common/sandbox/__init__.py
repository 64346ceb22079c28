"""Model-written code, run where it cannot hurt the service: one fresh process per run.

Thyme writes Python from user-supplied questions and images; our workers sit next to the
job store's credentials. So every execution is a new ``bwrap`` (bubblewrap, Debian's
``bubblewrap`` package) sandbox:

- new user, PID, network, IPC, UTS and cgroup namespaces: no network at all (not even
  the host's loopback), no other process visible, nothing to signal or trace;
- a file system of its own, read-only: ``/usr`` (libraries), the Python it runs and the
  image packages it may import, ``/opt/speceyes`` (the guest code); writable only
  ``/mnt/data`` (a private temporary folder holding a copy of the image) and an empty
  ``/tmp``; no home, no project tree, no ``/etc``;
- an empty environment (no database URL, no keys): only a few fixed variables;
- resource limits (CPU seconds, address space, open files, file size, threads) and a
  seccomp filter (``guest/seccomp.py``: no new processes, no exec, no ptrace, no
  sockets, no raising its limits), both set by the guest before it reads the code;
- a wall clock, and caps on what it prints and returns: over either, its whole process
  group is killed (and with it, through ``--die-with-parent``, the sandbox's PID
  namespace).

``isolation="none"`` runs the same guest as a plain child process (limits, seccomp and
the empty environment still apply, but it sees the host's files and network): only for
an operator who opted out with ``SPECEYES_ALLOW_UNSANDBOXED_CODE``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Literal

from common.config import AgentLimits, SandboxLimits, Settings
from common.errors import ConfigurationError

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

log = logging.getLogger(__name__)

Isolation = Literal["bubblewrap", "none"]
Stop = Literal["timeout", "output_limit", "killed", "no_result"]


class SandboxUnavailable(ConfigurationError):
    """The sandbox cannot run here (no bubblewrap, or the kernel refuses namespaces)."""


@dataclass(frozen=True)
class Execution:
    """How one run ended: ``result`` is the guest's report, or None with ``stop`` saying
    why (over the wall clock, over the output cap, killed by a signal, no report)."""

    result: dict[str, Any] | None
    stop: Stop | None
    detail: str  # for people: what stopped it, the tail of its stderr
    seconds: float


class Sandbox:
    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        isolation: Isolation = "bubblewrap",
        bwrap: str = "bwrap",
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.isolation = isolation
        self.bwrap_name = bwrap
        self.bwrap = shutil.which(bwrap) if isolation == "bubblewrap" else None
        self._site = _guest_site()

    @classmethod
    def for_agent(cls, limits: AgentLimits) -> Sandbox:
        return cls(limits.sandbox, isolation=limits.isolation, bwrap=limits.bwrap)

    def check(self) -> None:
        """Refuse (``SandboxUnavailable``, one clear message) unless a trivial program
        runs and reports back."""
        if self.isolation == "bubblewrap" and self.bwrap is None:
            raise SandboxUnavailable(
                "Thyme runs model-written code and needs bubblewrap to isolate it, but "
                f"{self.bwrap_name!r} is not an executable here: install the Debian "
                "package `bubblewrap` (make setup does, as root), or set "
                "SPECEYES_ALLOW_UNSANDBOXED_CODE=true to run that code WITHOUT isolation "
                "(it could then read this machine's files and reach its network)"
            )
        with tempfile.TemporaryDirectory(prefix="speceyes-probe-") as folder:
            run = self.run({"code": "print('ok')", **probe_request()}, Path(folder))
        if run.result is None or run.result.get("outputs") != ["ok"]:
            raise SandboxUnavailable(
                f"the code sandbox does not work here ({run.stop or 'wrong report'}: "
                f"{run.detail or run.result}); on hosts that restrict user namespaces, "
                "allow them for bwrap (e.g. sysctl kernel.unprivileged_userns_clone=1)"
            )

    def session(self) -> SandboxSession:
        """A private folder for one trajectory, with a guest process already starting."""
        return SandboxSession(self)

    def run(self, request: dict[str, Any], workdir: Path) -> Execution:
        """One execution in a process started for it (no warm spare)."""
        return self._finish(self._start(workdir), request)

    def _start(self, workdir: Path) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self._argv(workdir),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(GUEST_ENV) if self.isolation == "none" else {},
            cwd=workdir,
            start_new_session=True,
            close_fds=True,
        )

    def _finish(self, process: subprocess.Popen[bytes], request: dict[str, Any]) -> Execution:
        """Hand ``request`` to a started guest and read how it ends."""
        limits = self.limits
        started = time.perf_counter()
        assert process.stdin is not None
        try:
            process.stdin.write(json.dumps(request).encode())
            process.stdin.close()
        except BrokenPipeError:
            pass  # it died while starting: reported below from its stderr
        out, err, stop = _collect(process, started + limits.wall_s, limits.output_bytes)
        code = process.wait()
        seconds = time.perf_counter() - started
        tail = err[-2000:].decode("utf-8", "replace")
        if stop == "timeout":
            return Execution(None, stop, f"killed after {limits.wall_s:g} s (wall clock)", seconds)
        if stop == "output_limit":
            detail = f"killed: wrote more than {limits.output_bytes} bytes"
            return Execution(None, stop, detail, seconds)
        # a signal ends the guest: Popen says -N, bwrap (its parent) exits 128 + N
        number = -code if code < 0 else code - 128 if self.bwrap and code > 128 else 0
        if number:
            name = signal.Signals(number).name
            if number in (signal.SIGXCPU, signal.SIGKILL):
                name += f" (over the CPU time limit of {limits.cpu_s} s, or the memory)"
            return Execution(None, "killed", f"killed by {name}; {tail}", seconds)
        try:
            result = json.loads(out.decode("utf-8").splitlines()[-1])
            if not isinstance(result, dict):
                raise ValueError("not an object")
        except (ValueError, IndexError, UnicodeDecodeError):
            return Execution(None, "no_result", f"exit {code}, no report; {tail}", seconds)
        return Execution(result, None, tail, seconds)

    def _limits(self) -> str:
        """The guest's resource limits, as its one argument."""
        limits = self.limits
        return json.dumps(
            {
                "cpu_s": limits.cpu_s,
                "memory_bytes": limits.memory_mb << 20,
                "open_files": limits.open_files,
                "file_bytes": limits.file_mb << 20,
                "processes": limits.threads,
                "printed_chars": limits.output_bytes // 2,
            }
        )

    def _argv(self, workdir: Path) -> list[str]:
        python = Path(sys.base_prefix)
        executable = f"python{sys.version_info.major}.{sys.version_info.minor}"
        if self.isolation == "none":
            parents = dict.fromkeys(str(Path(source).parent) for source in self._site.values())
            path = os.pathsep.join([str(GUEST), *parents])
            return [
                str(python / "bin" / executable), "-I", "-S", "-c",
                f"import sys; sys.path[:0] = {path!r}.split({os.pathsep!r}); "
                "import runpy; runpy.run_path(sys.path[0] + '/harness.py', run_name='__main__')",
                self._limits(),
            ]  # fmt: skip
        assert self.bwrap is not None
        argv = [
            self.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
            "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL",
            "--ro-bind", "/usr", "/usr",
            "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
            "--symlink", "usr/bin", "/bin",
            "--ro-bind", str(python), PYTHON_MOUNT,
            "--ro-bind", str(GUEST), GUEST_MOUNT,
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--bind", str(workdir), WORK_MOUNT, "--chdir", WORK_MOUNT,
        ]  # fmt: skip
        for name, source in self._site.items():
            argv += ["--ro-bind", source, f"{SITE_MOUNT}/{name}"]
        for name, value in GUEST_ENV.items():
            argv += ["--setenv", name, value]
        argv += ["--setenv", "PYTHONPATH", SITE_MOUNT, "--remount-ro", "/"]
        return [
            *argv,
            f"{PYTHON_MOUNT}/bin/{executable}",
            "-S",
            f"{GUEST_MOUNT}/harness.py",
            self._limits(),
        ]

    def __repr__(self) -> str:
        return f"Sandbox(isolation={self.isolation!r}, limits={self.limits})"


class SandboxSession:
    """One trajectory's private folder (``folder`` on the host, ``/mnt/data`` inside) and
    its next guest process, started ahead so that its start-up (Python, the image
    libraries, the seccomp filter) overlaps the model's generation instead of adding to
    each execution. Every execution still gets a process of its own."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.folder = Path(tempfile.mkdtemp(prefix="speceyes-sandbox-"))
        self._spare: subprocess.Popen[bytes] | None = sandbox._start(self.folder)

    @property
    def root(self) -> str:
        """The folder as the code sees it."""
        return WORK_MOUNT if self.sandbox.isolation == "bubblewrap" else str(self.folder)

    def inside(self, relative: str) -> str:
        """A path in the folder, as the code sees it."""
        return f"{self.root}/{relative}"

    def outside(self, path: str) -> Path | None:
        """The host file a path the code named lies at; None unless it is a regular file
        in the folder (a link out of it is refused: the host resolves links itself)."""
        if not path.startswith(self.root + "/"):
            return None
        folder = self.folder.resolve()
        host = (folder / path[len(self.root) + 1 :]).resolve()
        if not host.is_relative_to(folder) or not host.is_file():
            return None
        return host

    def run(self, request: dict[str, Any]) -> Execution:
        process = self._spare or self.sandbox._start(self.folder)
        self._spare = None
        try:
            return self.sandbox._finish(process, request)
        finally:
            self._spare = self.sandbox._start(self.folder)

    def close(self) -> None:
        if self._spare is not None:
            _kill_group(self._spare)
            for stream in (self._spare.stdin, self._spare.stdout, self._spare.stderr):
                if stream is not None:
                    stream.close()
            self._spare = None
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> SandboxSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def require_code_sandbox(settings: Settings) -> None:
    """Where this process will run Thyme's trajectories: refuse to start unless the
    sandbox works (or the operator opted out, which is logged as the risk it is)."""
    if settings.agent != "thyme":
        return
    sandbox = Sandbox.for_agent(settings.agent_limits)
    if sandbox.isolation == "none":
        log.warning(
            "SPECEYES_ALLOW_UNSANDBOXED_CODE is set: Thyme's model-written code runs "
            "WITHOUT isolation and can read this machine's files and reach its network"
        )
    sandbox.check()


def probe_request() -> dict[str, Any]:
    """A request with every field but the code (for checks and benchmarks)."""
    return {
        "image_path": f"{WORK_MOUNT}/missing.jpg",
        "output_dir": f"{WORK_MOUNT}/out/",
        "model_output_dir": f"{WORK_MOUNT}/out/",
        "refused": [],
        "min_crop_side": 1,
    }


def _guest_site() -> dict[str, str]:
    """The installed files of the packages the guest may import, and the shared
    libraries their wheels carry (``*.libs`` folders beside them)."""
    site: dict[str, str] = {}
    for package in GUEST_PACKAGES:
        spec = find_spec(package)
        if spec is None or spec.origin is None:
            continue
        origin = Path(spec.origin)
        source = origin.parent if spec.submodule_search_locations else origin
        site[source.name] = str(source)
        if not spec.submodule_search_locations and spec.cached and Path(spec.cached).is_file():
            site[f"__pycache__/{Path(spec.cached).name}"] = spec.cached
        for libs in source.parent.glob("*.libs"):
            site[libs.name] = str(libs)
    return site


def _collect(
    process: subprocess.Popen[bytes], deadline: float, cap: int
) -> tuple[bytes, bytes, Stop | None]:
    """Read stdout and stderr until both close, the deadline passes or they exceed the
    cap; in the last two cases kill the process group."""
    assert process.stdout is not None and process.stderr is not None
    fds = process.stdout.fileno(), process.stderr.fileno()
    chunks: dict[int, list[bytes]] = {fd: [] for fd in fds}
    total = 0
    stop: Stop | None = None
    with selectors.DefaultSelector() as selector:
        for stream in (process.stdout, process.stderr):
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                stop = "timeout"
                break
            for key, _ in selector.select(remaining):
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                chunks[key.fd].append(data)
                total += len(data)
            if total > cap:
                stop = "output_limit"
                break
    if stop is not None:
        _kill_group(process)
    else:
        try:
            process.wait(max(0.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            stop = "timeout"
            _kill_group(process)
    process.stdout.close()
    process.stderr.close()
    return b"".join(chunks[fds[0]]), b"".join(chunks[fds[1]]), stop


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
