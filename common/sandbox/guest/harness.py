"""The guest side of one Thyme code execution: ``python harness.py`` inside the sandbox.

It starts before there is work for it (the host keeps one ready): it hides its result
channel, imports what every run needs, lowers its resource limits (``argv[1]``, JSON)
and locks itself down with seccomp. Then it reads one JSON request on stdin (the code,
the input image's path, the output folder), edits the code as Thyme's evaluation does
(``rewrite``), runs it with the evaluation's names in scope and its prints captured, and
writes one JSON line to its original stdout: ``{"outputs": [...], "printed": ...,
"error": ...}``. ``outputs`` lists what the evaluation would hand back to the model: the
processed images' paths, or the printed text; empty when the execution failed.

The host never trusts this line beyond its size and shape: everything here runs in the
same process as the model's code.
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import io
import json
import os
import re
import resource
import sys
import types
from contextlib import redirect_stdout
from typing import Any

IMAGE_GLOBS = ("jpg", "jpeg", "png", "bmp", "gif", "tiff")
PRINTED_IMAGE = r"\.(?:jpg|jpeg|png|bmp|gif|tiff))"


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


def _apply_limits(limits: dict[str, int]) -> None:
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_CPU, limits["cpu_s"], limits["cpu_s"] + 1)  # SIGXCPU, then KILL
    _limit(resource.RLIMIT_AS, limits["memory_bytes"])
    _limit(resource.RLIMIT_NOFILE, limits["open_files"])
    _limit(resource.RLIMIT_FSIZE, limits["file_bytes"])
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
        "print", "len", "str", "int", "float", "list", "dict", "tuple", "range", "round",
        "abs", "min", "max", "sum", "sorted", "any", "all", "zip", "map", "filter",
        "isinstance", "issubclass", "Exception", "ValueError", "TypeError", "AttributeError",
        "IndexError", "KeyError", "NotImplementedError", "enumerate", "pow", "divmod", "bin",
        "oct", "hex", "complex", "__import__", "globals", "locals", "open",
    ]  # fmt: skip
    scope = {name: getattr(builtins, name) for name in allowed}
    scope |= {"True": True, "False": False, "None": None}
    for name in ("itertools", "re", "time", "datetime", "math", "cmath", "collections"):
        scope[name] = importlib.import_module(name)
    scope |= {"os": os, "shutil": shutil, "json": json, "random": random}
    scope |= {"PIL": sys.modules["PIL"], "UnidentifiedImageError": UnidentifiedImageError}
    numpy = _LazyModule("numpy")
    names = {
        "__builtins__": scope, "os": os, "random": random, "string": string, "math": math,
        "Image": Image, "UnidentifiedImageError": UnidentifiedImageError, "numpy": numpy,
        "np": numpy, "json": json, "re": re,
    }  # fmt: skip
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


def _outputs(
    local: dict[str, Any], printed: str, code: str, folder: str
) -> tuple[list[str], str | None]:
    """What the evaluation hands back: images the code saved and named, else its print."""
    paths: list[str] = []
    error = None
    named = local.get("processed_path")
    if isinstance(named, str) and named.startswith(folder) and os.path.isfile(named):
        paths.append(named)
    elif isinstance(named, str) and named.startswith(folder) and not os.path.exists(named):
        error = f"'processed_path' variable set to '{named}', but file does not exist."
    elif named is not None:
        error = f"'processed_path' variable was '{named}', which is not a valid file path."
    if not printed:
        return paths, error
    saved = [path for ext in IMAGE_GLOBS for path in glob.glob(os.path.join(folder, f"*.{ext}"))]
    mentioned = 0
    missing = ""
    for match in re.finditer(rf"({re.escape(folder)}[^\s\'\"]+" + PRINTED_IMAGE, printed):
        mentioned += 1
        if os.path.isfile(match.group(1)):
            if match.group(1) not in paths:
                paths.append(match.group(1))
        elif not error:
            missing = f"Path '{match.group(1)}' found in print, but file does not exist."
    if not paths:
        named = len(re.findall(r"([^\s\'\"]+" + PRINTED_IMAGE, printed))
        if len(saved) in (mentioned, named):
            paths = saved
        else:
            error = missing
    if not paths and folder not in code:
        paths.append(printed)
    return paths, error


def main() -> None:
    result = os.fdopen(os.dup(1), "w")  # the result channel; fd 1 goes to stderr
    os.dup2(2, 1)
    # warm up before the request arrives (the host starts this process ahead of time)
    import autopep8  # noqa: F401
    import rewrite
    import seccomp
    from PIL import Image  # noqa: F401

    limits = json.loads(sys.argv[1])
    _apply_limits(limits)
    seccomp.install()
    request = json.loads(sys.stdin.read())
    sys.setrecursionlimit(2000)
    image_path, folder = request["image_path"], request["output_dir"].rstrip("/")
    code = request["code"]
    for pattern in request["refused"]:
        if re.search(pattern, code, re.IGNORECASE):
            report = {"outputs": [], "printed": "", "error": "refused: " + pattern}
            result.write(json.dumps(report) + "\n")
            return
    os.makedirs(folder, exist_ok=True)
    code = rewrite.rewrite(
        code, image_path, _image_size(image_path), model_output_dir=request["model_output_dir"],
        output_dir=folder, min_side=request["min_crop_side"],
    )  # fmt: skip
    names, local = _scope(image_path, folder)
    captured = _BoundedText(limits["printed_chars"])
    outputs: list[str] = []
    printed = ""
    try:
        with redirect_stdout(captured):
            exec(code, names, local)
        printed = captured.getvalue().strip()
        outputs, error = _outputs(local, printed, code, folder)
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
    report = {"outputs": outputs, "printed": printed, "error": error, "code": code}
    result.write(json.dumps(report) + "\n")
    result.flush()


if __name__ == "__main__":
    main()
