"""What the benchmarks run on: synthetic queries and corpora that look like the real
workload, deterministic in their seed."""

from __future__ import annotations

import random
from pathlib import Path

from PIL import Image, ImageDraw

from common.contracts import Query

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (230, 200, 40),
}
SHAPES = ("circle", "square")


def synthetic_queries(count: int, width: int, height: int, seed: int = 0) -> list[Query]:
    """``count`` images of one coloured shape each, with a colour question (half of them
    multiple choice). Deterministic in ``seed``."""
    rng = random.Random(seed)
    names = list(COLOURS)
    queries = []
    for index in range(count):
        colour, shape = rng.choice(names), rng.choice(SHAPES)
        image = Image.new("RGB", (width, height), (235, 235, 235))
        size = rng.randint(min(width, height) // 8, min(width, height) // 3)
        left, top = rng.randint(0, width - size), rng.randint(0, height - size)
        draw = ImageDraw.Draw(image)
        box = (left, top, left + size, top + size)
        (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=COLOURS[colour])
        question = f"What is the colour of the {shape}?"
        options = tuple(rng.sample(names, len(names))) if index % 2 else None
        queries.append(Query(f"bench-{index}", image, question, options))
    return queries


def write_corpus(folder: Path, count: int) -> None:
    """``count`` small distinct PNG files (distinct bytes make distinct jobs)."""
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        colour = (index % 251, index // 251 % 251, 120)
        Image.new("RGB", (32, 32), colour).save(folder / f"{index:06d}.png")
