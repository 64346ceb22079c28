"""Colour conversion and Qwen-VL's resize rule, shared by both sides of the sandbox
boundary.

The service shows a model every image as RGB, on the model's grid. An image Thyme's
code saves is decoded, converted and resized to that grid inside the sandbox (the host
never parses a file the code wrote, nor spends its own memory on a size the code chose)
by the same rules the host applies to uploaded images (``common.images`` imports them
from here): one rule, so a crop looks the same to the model whichever side made it.
"""

from __future__ import annotations

import math

from PIL import Image


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL mode to RGB; transparent pixels become white."""
    if image.mode == "RGB":
        return image
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
        image = image.point(lambda value: value * (255.0 / 65535.0)).convert("L")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        canvas.alpha_composite(rgba)
        return canvas.convert("RGB")
    return image.convert("RGB")


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Qwen-VL's target (height, width) for an image of ``height`` x ``width``, by the
    SpecEyes evaluation's rule (``eval_code_deepeyes/utils.py`` ``smart_resize``, the same
    in ``eval_code_thyme``), which differs from transformers' in two ways:

    - each side is at least ``factor`` before the pixel bounds are checked
      (``max(factor, round(side / factor) * factor)``): a 10x500 crop is shown at 28x504,
      where transformers' rule gives 28x420;
    - no aspect ratio is refused (transformers' refuses over 200): a 3x2000 crop is shown
      at 28x1988, which the model's processor then takes as it is.

    A side of 0 (an empty crop) is ``factor`` wide, as there; one that must then be
    enlarged to ``min_pixels`` has nothing to enlarge (the evaluation divides by zero):
    ``ValueError`` (``common.images.smart_resize``: ``ImageError``). Ours keeps each
    side at least ``factor`` when shrinking to ``max_pixels`` too (the evaluation's
    could reach 0 there, only for shapes no decoded image or crop of ours has)."""
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        if min(height, width) <= 0:
            raise ValueError(f"image has no pixels to enlarge ({width}x{height})")
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar
