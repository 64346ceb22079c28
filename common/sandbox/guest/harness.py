"""The guest side of one Thyme code execution: ``python harness.py`` inside the sandbox.

It starts before there is work for it (the host keeps one ready) and splits in two:

- **the init** (the parent, PID 1 of the sandbox's namespace) runs none of the code. It
  waits for the guest, then writes how the guest ended (its wait status: an exit code
  or a signal, never confused) as the last bytes on the result channel, after all the
  guest could write (``STATUS_MARK``). Its stdin is held open by the worker alone for as
  long as the execution lasts: when it hangs up, the worker is gone (killed, OOM), and
  the init kills the guest and ends, which ends the namespace. No janitor is needed for
  the guest to die with its worker.
- **the guest** (its child) hides its result channel, imports what every run needs,
  arms its death with the init, lowers its resource limits (``argv[1]``, JSON) and locks
  itself down with seccomp. Then it reads one JSON request line on stdin (the code, the
  input image's path, the output folder, the model's grid and what the trajectory may
  still be shown), edits the code as Thyme's evaluation does (``rewrite``), runs it with
  the evaluation's names in scope and its prints captured, and decides what goes back
  to the model (``outputs``).

The guest writes one JSON line to its original stdout, ``{"images": [{"width",
"height", "source_width", "source_height"}...], "text", "printed", "error", "notes"}``,
followed by each image's raw RGB bytes on the model's grid: the images to show
(``images``), else the text to show (``text``), else nothing (the execution failed:
``error`` says why).

The host never trusts any of the guest's report beyond its size and shape: everything
there runs in the same process as the model's code, which can write anything to that
channel. The init's status comes after the guest has ended, so the guest cannot write
past it.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import json
import os
import re
import resource
import select
import signal
import sys
import types
from contextlib import redirect_stdout
from typing import Any

_PR_SET_PDEATHSIG = 1
# the init's last bytes on the result channel: the mark, the guest's wait status as eight
# hex digits, a newline (the host reads it from the end: ``channel.split_status``)
STATUS_MARK = b"\n\x00speceyes-status "


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
    # as PID 1 of its namespace the guest ignores SIGXCPU: the hard limit's SIGKILL ends it
    _limit(resource.RLIMIT_CPU, limits["cpu_s"])
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
    guest = os.fork()
    if guest == 0:
        _guest(json.loads(sys.argv[1]))
    _init(guest)


def _init(guest: int) -> None:
    """Wait for the guest; end it when stdin hangs up (the worker is gone); then report
    its wait status after everything it wrote, and end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the guest may signal us; nothing ends us)
    wake, woken = os.pipe()
    os.set_blocking(woken, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(woken)  # a byte on ``wake`` at every SIGCHLD
    watch = select.poll()
    watch.register(0, select.POLLHUP)  # (not POLLIN: the request is the guest's to read)
    watch.register(wake, select.POLLIN)
    while True:
        pid, status = os.waitpid(guest, os.WNOHANG)  # (after the wake-up fd is set: no race)
        if pid == guest:
            break
        for fd, events in watch.poll():
            if fd == 0 and events & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                os.kill(guest, signal.SIGKILL)  # the worker is gone
                os._exit(1)
            if fd == wake:
                os.read(wake, 512)
    os.write(1, STATUS_MARK + b"%08x\n" % (status & 0xFFFFFFFF))
    os._exit(0)


def _guest(limits: dict[str, Any]) -> None:
    result = os.fdopen(os.dup(1), "wb")  # the result channel; fd 1 goes to stderr
    os.dup2(2, 1)
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
    request = json.loads(sys.stdin.readline())
    sys.setrecursionlimit(2000)
    report, images = _execute(request, limits, outputs, rewrite)
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
        report["printed"] = printed = captured.getvalue().strip()
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
            report["text"] = paths[0]
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
    return {**report, "error": error}, images


if __name__ == "__main__":
    main()
