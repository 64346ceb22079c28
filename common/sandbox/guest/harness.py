"""The guest side of one Thyme code execution: ``python harness.py`` inside the sandbox.

It starts before there is work for it (the host keeps one ready) and splits in two:

- **the init** (the parent, PID 1 of the sandbox's namespace) runs none of the code and
  owns the sandbox's stdout. It reads the request line on stdin and hands it to the
  guest through a pipe of their own, relays what the guest writes back through another,
  and, once the guest has ended, writes its wait status (an exit code or a signal, never
  confused: ``STATUS_MARK``) after all of it. The worker holds stdin open for as long as
  the execution lasts: when it hangs up, the worker is gone (killed, OOM), and the init
  kills the guest and ends, which ends the namespace; it does the same ``wall_s`` (and a
  grace) after the request, should the worker be unable to. It is not dumpable, and the
  guest may signal only itself (``seccomp``).
- **the guest** (its child) keeps only its request (fd 0), stderr (fd 1 and 2) and its
  result channel (fd 3, to the init), imports what every run needs, arms its death with
  the init, lowers its resource limits (``argv[1]``, JSON) and locks itself down with
  seccomp. Then it reads its one JSON request (the code, the input image's path, the
  output folder, the model's grid and what the trajectory may still be shown), edits
  the code as Thyme's evaluation does (``rewrite``), runs it with the evaluation's names
  in scope and its prints captured, and decides what goes back to the model
  (``outputs``).

The guest writes one JSON line on its result channel, ``{"images": [{"width", "height",
"source_width", "source_height"}...], "text", "printed", "error", "notes"}`` (each text
cut at ``text_chars``), followed by each image's raw RGB bytes on the model's grid: the
images to show (``images``), else the text to show (``text``), else nothing (the
execution failed: ``error`` says why).

The host never trusts any of the guest's report beyond its size and shape: everything
there runs in the same process as the model's code, which can write anything to that
channel. The init's status comes after the guest has ended, on a stream the guest
cannot reach, so the guest cannot write past it.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import importlib.util
import io
import json
import math
import os
import re
import resource
import select
import signal
import sys
import time
import types
from contextlib import redirect_stdout
from typing import Any

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
RESULT_FD = 3  # the guest's result channel (to its init, which relays it)
WATCHDOG_GRACE_S = 5.0  # the init ends a guest this long after the worker's wall clock
# the init's last bytes on the result channel: the mark, the guest's wait status as eight
# hex digits, a newline (the host reads it from the end: ``channel.split_status``)
STATUS_MARK = b"\n\x00speceyes-status "
READY_MARK = b"\x06"  # the init's first byte on the result channel: the guest is ready


class PrintLimit(Exception):
    """The code printed more than the sandbox hands back."""


class _BoundedText(io.StringIO):
    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.size = limit, 0

    def write(self, text: str) -> int:
        self.size += len(text)
        if self.size > self.limit:
            raise PrintLimit(f"the code printed more than {self.limit} characters")
        return super().write(text)


class _LazyModule(types.ModuleType):
    """A module imported on first use: ``np`` and ``cv2`` are in scope as the evaluation
    has them, without every execution paying for their import."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(importlib.import_module(self._name), attribute)


def _limit(kind: int, value: int, hard: int | None = None) -> None:
    resource.setrlimit(kind, (value, value if hard is None else hard))


def _apply_limits(limits: dict[str, Any]) -> None:
    _limit(resource.RLIMIT_CORE, 0)
    # the kernel's limit counts the process's whole life (at it, SIGKILL); where the group
    # counts the code's own CPU, the warm-up is added, so that the kernel never ends the
    # code before the group's exact count does (a slow warm-up on a busy machine did)
    warm_up = 0
    if limits["cpu_after_warm_up"]:
        used = resource.getrusage(resource.RUSAGE_SELF)
        warm_up = math.ceil(used.ru_utime + used.ru_stime)
    _limit(resource.RLIMIT_CPU, warm_up + limits["cpu_backstop_s"])
    _limit(resource.RLIMIT_AS, limits["memory_bytes"])
    _limit(resource.RLIMIT_NOFILE, limits["open_files"])
    _limit(resource.RLIMIT_FSIZE, limits["file_bytes"])
    if limits["processes"] is not None:  # (None: a control group counts them)
        _limit(resource.RLIMIT_NPROC, limits["processes"])


def _scope(image_path: str, output_dir: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The evaluation's globals (its allowed builtins among them) and locals."""
    import builtins
    import math
    import random
    import shutil
    import string

    from PIL import Image, UnidentifiedImageError

    allowed = [  # the evaluation's allowed builtins
        "print",
        "len",
        "str",
        "int",
        "float",
        "list",
        "dict",
        "tuple",
        "range",
        "round",
        "abs",
        "min",
        "max",
        "sum",
        "sorted",
        "any",
        "all",
        "zip",
        "map",
        "filter",
        "isinstance",
        "issubclass",
        "Exception",
        "ValueError",
        "TypeError",
        "AttributeError",
        "IndexError",
        "KeyError",
        "NotImplementedError",
        "enumerate",
        "pow",
        "divmod",
        "bin",
        "oct",
        "hex",
        "complex",
        "__import__",
        "globals",
        "locals",
        "open",
    ]
    scope = {name: getattr(builtins, name) for name in allowed}
    scope |= {"True": True, "False": False, "None": None}
    for name in ("itertools", "re", "time", "datetime", "math", "cmath", "collections"):
        scope[name] = importlib.import_module(name)
    scope |= {"os": os, "shutil": shutil, "json": json, "random": random}
    scope |= {"PIL": sys.modules["PIL"], "UnidentifiedImageError": UnidentifiedImageError}
    numpy = _LazyModule("numpy")
    names = {
        "__builtins__": scope,
        "os": os,
        "random": random,
        "string": string,
        "math": math,
        "Image": Image,
        "UnidentifiedImageError": UnidentifiedImageError,
        "numpy": numpy,
        "np": numpy,
        "json": json,
        "re": re,
    }
    if importlib.util.find_spec("cv2") is not None:
        names["cv2"] = _LazyModule("cv2")
    return names, {"image_path": image_path, "temp_output_dir": output_dir}


def _image_size(path: str) -> tuple[int, int] | None:
    from PIL import Image

    try:
        with Image.open(path) as image:
            return image.size
    except Exception:
        return None


def _die_with_parent() -> None:
    """SIGKILL when the init dies (the filter then keeps it so): the init is of the
    guest's uid, so the kernel may deliver it."""
    import ctypes

    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def main() -> None:
    limits = json.loads(sys.argv[1])
    request, for_request = os.pipe()  # the init hands the guest its request here ...
    from_guest, results = os.pipe()  # ... and relays what it writes back from here;
    started, ready = os.pipe()  # the guest says here that it is ready for its code
    guest = os.fork()
    if guest == 0:
        for fd in (for_request, from_guest, started):
            os.close(fd)
        _guest(limits, request, results, ready)
    for fd in (request, results, ready):
        os.close(fd)
    _init(guest, limits["wall_s"] + WATCHDOG_GRACE_S, for_request, from_guest, started)


def _init(guest: int, wall_s: float, for_request: int, from_guest: int, started: int) -> None:
    """Hand the guest its request, relay what it writes back, end it when the worker is
    gone (stdin hangs up) or ``wall_s`` after it is ready for its code; then write its
    wait status after everything it wrote (stdout is the init's alone: the guest cannot
    reach it). When the guest is ready, the init says so first (``READY_MARK``): the
    worker's wall clock counts from there, not from a start a busy machine made slow."""
    libc = ctypes.CDLL(None)
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # (gVisor's /proc of it: root's only)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a PID 1 takes no signal it does not handle)
    wake, woken = os.pipe()
    os.set_blocking(woken, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(woken)  # a byte on ``wake`` at every SIGCHLD
    os.set_blocking(1, True)
    watch = select.poll()
    watch.register(0, select.POLLIN)  # the request, then only its hanging up
    watch.register(started, select.POLLIN)
    watch.register(from_guest, select.POLLIN)
    watch.register(wake, select.POLLIN)
    order = {started: 0, wake: 1, 0: 2, from_guest: 3}  # (ready is said before any result)
    line, handed, deadline, status, relaying = b"", False, None, None, True
    while True:
        if status is None:
            pid, waited = os.waitpid(guest, os.WNOHANG)  # (after the wake-up fd is set)
            status = waited if pid == guest else None
        if status is not None and not relaying:
            break
        left: int | None = None
        if deadline is not None:
            left = max(0, int((deadline - time.monotonic()) * 1000))
        events = sorted(watch.poll(left), key=lambda event: order[event[0]])
        if deadline is not None and time.monotonic() > deadline:
            _end(guest)  # (the worker kills it first; this is for a worker that cannot)
        for fd, event in events:
            if fd == wake:
                os.read(wake, 512)
            elif fd == started:
                watch.unregister(started)
                if os.read(started, 1):
                    _write_all(guest, READY_MARK)
                    deadline = time.monotonic() + wall_s
            elif fd == from_guest:
                data = os.read(from_guest, 1 << 20)
                if data:
                    _write_all(guest, data)
                else:
                    watch.unregister(from_guest)
                    relaying = False
            elif not handed and event & select.POLLIN:  # (the request)
                data = os.read(0, 1 << 16)
                line += data
                if not data:
                    _end(guest)  # the worker is gone
                if b"\n" in line:
                    _write_all(guest, line[: line.index(b"\n") + 1], fd=for_request)
                    os.close(for_request)
                    handed = True
                    watch.modify(0, select.POLLHUP)
            elif event & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                _end(guest)  # stdin hung up: the worker is gone
    _write_all(guest, STATUS_MARK + b"%08x\n" % (status & 0xFFFFFFFF))
    os._exit(0)


def _write_all(guest: int, data: bytes, fd: int = 1) -> None:
    """Write all of ``data`` (the worker reads as it can); a worker gone ends the guest."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except OSError:
            _end(guest)


def _end(guest: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(guest, signal.SIGKILL)
    os._exit(1)


def _guest(limits: dict[str, Any], request: int, results: int, ready: int) -> None:
    """The guest: its request on fd 0, its result channel fd 3, fd 1 and 2 to stderr;
    nothing else open, nothing of the init's (``ready`` is closed once said)."""
    os.dup2(request, 0)
    channel = os.dup(results)
    os.dup2(2, 1)
    os.dup2(channel, RESULT_FD)
    readiness = os.dup(ready) if ready < RESULT_FD + 1 else ready  # (kept past the closing)
    os.closerange(RESULT_FD + 1, readiness)
    os.closerange(readiness + 1, 1 << 16)
    result = os.fdopen(RESULT_FD, "wb")
    # warm up before the request arrives (the host starts this process ahead of time)
    import autopep8  # noqa: F401
    import outputs
    import rewrite
    import seccomp
    from PIL import Image  # noqa: F401

    os.chdir(limits["workdir"])
    _die_with_parent()
    _apply_limits(limits)
    seccomp.install(refuse_times=limits["host_devices"])
    os.write(readiness, b"!")  # ready: the wall clock of the code starts now
    os.close(readiness)
    request_line = sys.stdin.readline()
    sys.setrecursionlimit(2000)
    report, images = _execute(json.loads(request_line), limits, outputs, rewrite)
    result.write(json.dumps(report).encode() + b"\n")
    for data in images:
        result.write(data)
    result.flush()
    os._exit(0)  # now: no waiting for threads the code left running, no atexit hooks


def _execute(
    request: dict[str, Any], limits: dict[str, Any], outputs: Any, rewrite: Any
) -> tuple[dict[str, Any], list[bytes]]:
    """Run the request's code; (the report, the raw RGB bytes of the images it names)."""
    image_path, folder = request["image_path"], request["output_dir"].rstrip("/")
    code = request["code"]
    report: dict[str, Any] = {"images": [], "text": None, "printed": "", "notes": []}
    for pattern in request["refused"]:
        if re.search(pattern, code, re.IGNORECASE):
            return {**report, "error": "refused: " + pattern}, []
    os.makedirs(folder, exist_ok=True)
    code = rewrite.rewrite(
        code,
        image_path,
        _image_size(image_path),
        model_output_dir=request["model_output_dir"],
        output_dir=folder,
        min_side=request["min_crop_side"],
    )
    names, local = _scope(image_path, folder)
    captured = _BoundedText(limits["printed_chars"])
    images: list[bytes] = []
    error = None
    try:
        with redirect_stdout(captured):
            exec(code, names, local)
        printed = captured.getvalue().strip()
        report["printed"] = printed[: limits["text_chars"]]
        paths, error = outputs.hand_back(local, printed, code, folder)
        if paths and os.path.exists(paths[0]):
            report["images"], images, report["notes"] = outputs.frames(
                paths,
                most=limits["images"],
                pixels=limits["image_pixels"],
                file_bytes=limits["file_bytes"],
                view=request.get("view"),
            )
        elif paths:
            report["text"] = paths[0][: limits["text_chars"]]
    except ImportError as exc:
        error = f"Code execution failed due to ImportError: {exc}"
    except MemoryError as exc:
        error = f"Code execution failed due to MemoryError: {exc}"
    except SyntaxError as exc:
        error = f"Code execution failed due to SyntaxError: {exc}"
    except PrintLimit as exc:
        error = str(exc)
    except Exception as exc:
        error = f"Code execution failed: {type(exc).__name__}: {exc}"
    return {**report, "error": error and error[: limits["text_chars"]]}, images


if __name__ == "__main__":
    main()
