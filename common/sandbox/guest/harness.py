"""The guest side of one Thyme code execution: ``python harness.py`` inside the sandbox.

It starts before there is work for it (the host keeps one ready): it hides its result
channel, imports what every run needs, arms its death with its parent, lowers its
resource limits (``argv[1]``, JSON) and locks itself down with seccomp. Then it reads
one JSON request on stdin (the code, the input image's path, the output folder), edits
the code as Thyme's evaluation does (``rewrite``), runs it with the evaluation's names in
scope and its prints captured, and decides what goes back to the model (``outputs``).

It writes one JSON line to its original stdout, ``{"images": [{"width", "height"}...],
"text", "printed", "error", "notes"}``, followed by each image's raw RGB bytes: the
images to show (``images``), else the text to show (``text``), else nothing (the
execution failed: ``error`` says why).

The host never trusts any of it beyond its size and shape: everything here runs in the
same process as the model's code, which can write anything to that channel.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import json
import os
import re
import resource
import signal
import sys
import types
from contextlib import redirect_stdout
from typing import Any

_PR_SET_PDEATHSIG = 1


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
    """SIGKILL when the process that started us dies (the filter then keeps it so)."""
    import ctypes

    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def main() -> None:
    result = os.fdopen(os.dup(1), "wb")  # the result channel; fd 1 goes to stderr
    os.dup2(2, 1)
    # warm up before the request arrives (the host starts this process ahead of time)
    import autopep8  # noqa: F401
    import outputs
    import rewrite
    import seccomp
    from PIL import Image  # noqa: F401

    limits = json.loads(sys.argv[1])
    os.chdir(limits["workdir"])
    _die_with_parent()
    _apply_limits(limits)
    seccomp.install()
    request = json.loads(sys.stdin.read())
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
