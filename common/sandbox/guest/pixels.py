"""Colour conversion shared by both sides of the sandbox boundary.

The service shows a model every image as RGB. An image Thyme's code saves is decoded
and converted inside the sandbox (the host never parses a file the code wrote) by the
same rule the host applies to uploaded images (``common.images`` imports it from here):
one rule, so a crop looks the same to the model whichever side converted it.
"""

from __future__ import annotations

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
