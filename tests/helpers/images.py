"""Images a test makes: in memory, as PNG bytes, or as a folder of distinct files."""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image


def png(size: tuple[int, int] = (32, 24), colour: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def write_images(folder: Path, count: int, size: tuple[int, int] = (64, 48)) -> list[Path]:
    """``count`` distinct small PNGs (distinct bytes: distinct jobs)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        path = folder / f"img{index:03d}.png"
        Image.new("RGB", size, (index * 7 % 256, index * 13 % 256, 90)).save(path)
        paths.append(path)
    return paths
