"""What one execution hands back to the model, decided and prepared inside the sandbox.

The rule is the SpecEyes evaluation's (``eval_code_thyme/sandbox.py``): the image named
by ``processed_path``, else image paths found in the printed text, else every image in
the output folder when their number matches what was printed, else the printed text
itself when the code never mentions the output folder. ``hand_back`` follows it; the
evaluation's two path regexes are matched here in linear time (``printed_paths``: a
regex with ``[^\\s'"]+`` before the extension backtracks quadratically on long output).

The images are then decoded here, not by the host: ``frames`` reads each one as an
untrusted file (no links, regular files only, sizes checked before reading, PNG or JPEG
only, pixels counted before decoding), refuses a shape no model is shown (an aspect
ratio over the uploads' limit), resizes it to the model's grid (Qwen-VL's rule, bicubic,
as the host would) within what the trajectory may still be shown, and turns it into raw
RGB bytes. The host reads nothing but those bytes, whose length it checks against the
size they claim, and that size against the grid and the budget: what the host holds
is what the model sees, never more, whatever size the code saved.
"""

from __future__ import annotations

import glob
import io
import os
import re
import stat
from typing import Any

from PIL import Image, ImageOps

try:  # the host imports this module (tests); the guest imports it by bare name
    from .pixels import smart_resize, to_rgb
except ImportError:
    from pixels import smart_resize, to_rgb  # type: ignore[no-redef]

IMAGE_GLOBS = ("jpg", "jpeg", "png", "bmp", "gif", "tiff")
_EXTENSIONS = tuple(f".{extension}" for extension in IMAGE_GLOBS)
_WORD = re.compile(r"[^\s'\"]+")  # the evaluation's path characters
_SIGNATURES = {b"\x89PNG\r\n\x1a\n": "PNG", b"\xff\xd8\xff": "JPEG"}
Image.MAX_IMAGE_PIXELS = None  # ours is checked before any decode, and is lower
MOST_NOTES = 8  # notes on images left out, in one report (the host refuses more)


def printed_paths(printed: str, prefix: str = "") -> list[str]:
    """``re.findall(prefix + r"[^\\s'\"]+\\.(?:jpg|jpeg|png|bmp|gif|tiff)", printed)``,
    without its backtracking: within each run of path characters, a match starts at the
    next ``prefix`` and ends at the last extension it can reach (the greedy choice)."""
    found: list[str] = []
    for word in _WORD.finditer(printed):
        text, position = word.group(), 0
        while position < len(text):
            start = text.find(prefix, position)
            if start < 0:
                break
            end = _last_extension_end(text, start + len(prefix) + 1)
            if end is None:
                break  # a later start would need an extension further right still
            found.append(text[start:end])
            position = end
    return found


def _last_extension_end(text: str, first_dot: int) -> int | None:
    """The end of the rightmost ``.<extension>`` whose dot is at ``first_dot`` or later."""
    dot = len(text)
    while (dot := text.rfind(".", first_dot, dot)) >= 0:
        for extension in _EXTENSIONS:  # the regex's order; no two match at one dot
            if text.startswith(extension, dot):
                return dot + len(extension)
    return None


def hand_back(
    local: dict[str, Any], printed: str, code: str, folder: str
) -> tuple[list[str], str | None]:
    """(the paths of the images to show, or [the printed text]; an error message)."""
    paths: list[str] = []
    error = None
    named = local.get("processed_path")
    if isinstance(named, str) and named.startswith(folder) and os.path.isfile(named):
        paths.append(named)
    elif isinstance(named, str) and named.startswith(folder) and not os.path.exists(named):
        error = f"'processed_path' variable set to '{named}', but file does not exist."
    elif named is not None:
        shown = str(named)[:200]
        error = f"'processed_path' variable was '{shown}', which is not a valid file path."
    if not printed:
        return paths, error
    saved = [path for ext in IMAGE_GLOBS for path in glob.glob(os.path.join(folder, f"*.{ext}"))]
    mentioned = printed_paths(printed, folder)
    missing = ""
    for path in mentioned:
        if os.path.isfile(path):
            if path not in paths:
                paths.append(path)
        elif not error:
            missing = f"Path '{path}' found in print, but file does not exist."
    if not paths:
        if len(saved) in (len(mentioned), len(printed_paths(printed))):
            paths = saved
        else:
            error = missing
    if not paths and folder not in code:
        paths.append(printed)
    return paths, error


def frames(
    paths: list[str],
    *,
    most: int,
    pixels: int,
    file_bytes: int,
    view: dict[str, Any] | None = None,
) -> tuple[list[dict[str, int]], list[bytes], list[str]]:
    """The first ``most`` readable images among ``paths`` as raw RGB: (their sizes,
    their bytes, why others were left out), ``pixels`` at most decoded in all.

    ``view`` (``factor``, ``min_pixels``, ``max_pixels``: the model's grid;
    ``max_aspect``; ``pixels``: what the trajectory may still be shown): each image is
    sent as the model sees it, resized to the grid; one whose aspect ratio is over
    ``max_aspect``, or whose view would not fit in what is left, is left out."""
    sizes: list[dict[str, int]] = []
    data: list[bytes] = []
    notes: list[str] = []
    shown_left: int = view["pixels"] if view is not None else 0
    for path in paths:
        if len(sizes) == most:
            notes.append(f"{len(paths) - most} more image(s) not shown (at most {most})")
            break
        name = os.path.basename(path)[:100]
        try:
            image = _decode(path, pixels, file_bytes)
            pixels -= image.width * image.height
            shown = image if view is None else _on_grid(image, view, shown_left)
        except Exception as exc:  # whatever it is, this image is left out, with why
            notes.append(f"{name}: {exc}"[:300])
            continue
        shown_left -= shown.width * shown.height
        sizes.append(
            {
                "width": shown.width,
                "height": shown.height,
                "source_width": image.width,
                "source_height": image.height,
            }
        )
        data.append(shown.tobytes())
        del image, shown  # (one decoded image at a time)
    if len(notes) > MOST_NOTES:
        notes[MOST_NOTES - 1 :] = [f"{len(notes) - MOST_NOTES + 1} more image(s) left out"]
    return sizes, data, notes


def _on_grid(image: Image.Image, view: dict[str, Any], shown_left: int) -> Image.Image:
    """``image`` as the model is shown it (resized to the grid, bicubic); ValueError where
    it is not shown: a shape over ``max_aspect``, or more than ``shown_left`` pixels."""
    width, height = image.size
    if max(width, height) > view["max_aspect"] * min(width, height):
        raise ValueError(
            f"{width}x{height}: its aspect ratio is over {view['max_aspect']:g}, "
            "a shape no model is shown"
        )
    factor = view["factor"]
    new_height, new_width = smart_resize(
        height, width, factor, view["min_pixels"], view["max_pixels"]
    )
    if new_width * new_height > shown_left:
        tokens, left = new_width * new_height // factor**2, shown_left // factor**2
        raise ValueError(
            f"{width}x{height}: {tokens} visual tokens, over the {left} this trajectory "
            "may still be shown (sandbox.view_tokens)"
        )
    if (new_width, new_height) == image.size:
        return image
    return image.resize((new_width, new_height), Image.Resampling.BICUBIC)


def _decode(path: str, pixels: int, file_bytes: int) -> Image.Image:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    handle = os.open(path, flags)
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_nlink != 1:
            raise ValueError("a file with other names (hard links) is not read")
        if info.st_size > file_bytes:
            raise ValueError(f"{info.st_size} bytes, above {file_bytes}")
        content = os.read(handle, file_bytes + 1)
    finally:
        os.close(handle)
    if not any(content.startswith(signature) for signature in _SIGNATURES):
        raise ValueError("neither PNG nor JPEG")
    image = Image.open(io.BytesIO(content), formats=("PNG", "JPEG"))
    if image.width * image.height > pixels:
        raise ValueError(f"{image.width}x{image.height} is over the {pixels} pixels left")
    image.load()
    ImageOps.exif_transpose(image, in_place=True)
    return to_rgb(image)
