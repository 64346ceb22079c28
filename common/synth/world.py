"""SpecEyes-Synth: a small generated world where tiny models can learn the real task.

Each item is an 896 x 896 image of one coloured shape on a lightly textured background,
and a question about it. The shape sits in a 4 x 4 grid of 224-pixel cells:

- **easy** items have a large shape (128-208 px): readable at the small model's view
  (the image is shown at 128 px: 18-30 px, about a patch) and at the agent's (224 px);
- **hard** items have a small shape (24-32 px): 3-5 px at the small model's view, too
  little of one patch to read, 6-8 px at the agent's, enough to see where it is, and
  2-3 patches after zooming into its cell (the cell is shown at 224 px).

Questions come in two kinds, as in the benchmarks: "What is the color of the <shape>?"
with four colour options (V* style), and "Is there a <color> <shape> in the image?"
(yes / no, POPE style, half of them yes). Everything is seeded and deterministic: the
same seed gives the same items, pixel for pixel.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from PIL import Image, ImageDraw

SIZE = 896
GRID = 4
CELL = SIZE // GRID  # 224: a cell is shown at 224 px after zooming, as the whole image is
COLOURS = {
    "red": (215, 40, 40),
    "green": (40, 165, 60),
    "blue": (45, 80, 220),
    "yellow": (235, 200, 30),
}
SHAPES = ("circle", "square", "triangle")
EASY_SIZES = (128, 208)
HARD_SIZES = (24, 32)
MARGIN = 8
AGENT_VIEW = 224  # the tiny agent model's view of a SIZE x SIZE image (factor 28)
# The small model's view (factor 32). At 256 px it read hard targets (7-9 px) 87% of the
# time and was as sure of them as of easy ones: the gate had nothing to separate.
SMALL_VIEW = 128


@dataclass(frozen=True)
class SynthItem:
    id: str
    seed: int
    kind: str  # "choice" (V*-style) or "yesno" (POPE-style)
    difficulty: str  # "easy" or "hard"
    shape: str
    colour: str
    box: tuple[int, int, int, int]  # the shape's bounding box, original pixels
    cell: tuple[int, int, int, int]  # the grid cell holding it: the box to zoom into
    question: str
    options: list[str] | None  # choice: four colours, shuffled
    answer: str  # choice: the colour; yesno: "yes" / "no"
    asked: str | None = None  # yesno: the colour the question names

    @property
    def answer_letter(self) -> str | None:
        return "ABCD"[self.options.index(self.answer)] if self.options else None

    def view_box(self, view: int = AGENT_VIEW) -> list[int]:
        """The zoom cell in pixels of a ``view`` x ``view`` rendering of the image."""
        scale = view / SIZE
        return [round(value * scale) for value in self.cell]

    def render(self) -> Image.Image:
        return render(self)


def make_item(
    seed: int,
    *,
    difficulty: str | None = None,
    kind: str | None = None,
    sizes: tuple[int, int] | None = None,
) -> SynthItem:
    """The item of ``seed`` (its difficulty / kind drawn unless given). ``sizes`` overrides
    the difficulty's target sizes (training curricula only; the world never uses it)."""
    rng = random.Random(seed)
    difficulty = difficulty or rng.choice(("easy", "hard"))
    kind = kind or rng.choice(("choice", "yesno"))
    shape, colour = rng.choice(SHAPES), rng.choice(list(COLOURS))
    low, high = sizes or (EASY_SIZES if difficulty == "easy" else HARD_SIZES)
    side = rng.randint(low, high)
    row, col = rng.randrange(GRID), rng.randrange(GRID)
    slack = CELL - side - 2 * MARGIN  # the shape stays inside its cell
    left = col * CELL + MARGIN + rng.randint(0, slack)
    top = row * CELL + MARGIN + rng.randint(0, slack)
    box = (left, top, left + side, top + side)
    cell = (col * CELL, row * CELL, (col + 1) * CELL, (row + 1) * CELL)
    asked: str | None = None
    if kind == "choice":
        options = list(COLOURS)
        rng.shuffle(options)
        question, answer = f"What is the color of the {shape}?", colour
    else:
        options = None
        asked = colour if rng.random() < 0.5 else rng.choice([c for c in COLOURS if c != colour])
        question = f"Is there a {asked} {shape} in the image?"
        answer = "yes" if asked == colour else "no"
    return SynthItem(
        f"synth-{seed}",
        seed,
        kind,
        difficulty,
        shape,
        colour,
        box,
        cell,
        question,
        options,
        answer,
        asked,
    )


def items(count: int, seed: int = 0) -> Iterator[SynthItem]:
    """``count`` items; item i uses its own seed, derived from (seed, i)."""
    for index in range(count):
        digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
        yield make_item(int.from_bytes(digest[:6], "big"))


def render(item: SynthItem) -> Image.Image:
    """The item's image: textured light background, one filled shape."""
    rng = random.Random(item.seed ^ 0x5EED)
    base = rng.randint(200, 235)
    image = Image.new("RGB", (SIZE, SIZE), (base, base, base))
    draw = ImageDraw.Draw(image)
    for _ in range(400):  # light texture: faint grey specks
        x, y, r = rng.randrange(SIZE), rng.randrange(SIZE), rng.randint(2, 6)
        shade = base + rng.randint(-18, 18)
        draw.ellipse((x - r, y - r, x + r, y + r), fill=(shade, shade, shade))
    left, top, right, bottom = item.box
    fill = COLOURS[item.colour]
    if item.shape == "circle":
        draw.ellipse((left, top, right - 1, bottom - 1), fill=fill)
    elif item.shape == "square":
        draw.rectangle((left, top, right - 1, bottom - 1), fill=fill)
    else:
        draw.polygon(
            [((left + right) / 2, top), (left, bottom - 1), (right - 1, bottom - 1)], fill=fill
        )
    return image


# -- writers: the benchmark formats of shared/SPEC.md §3, and our manifest ----------------
def write_manifest(items_: list[SynthItem], folder: Path) -> Path:
    """PNG images + ``manifest.jsonl`` (image, question, options, id, answer)."""
    (folder / "images").mkdir(parents=True, exist_ok=True)
    manifest = folder / "manifest.jsonl"
    with manifest.open("w") as out:
        for item in items_:
            item.render().save(folder / "images" / f"{item.id}.png", optimize=True)
            row: dict[str, object] = {
                "id": item.id,
                "image": f"images/{item.id}.png",
                "question": item.question,
                "answer": item.answer,
                "difficulty": item.difficulty,
            }
            if item.options:
                row["options"] = item.options
            out.write(json.dumps(row) + "\n")
    return manifest


def write_vstar(items_: list[SynthItem], folder: Path) -> None:
    """V*-format: ``<category>/<id>.jpg`` + ``<id>.json`` {question, options}, the correct
    option FIRST (the loader shuffles). Choice items go to direct_attributes."""
    target = folder / "direct_attributes"
    target.mkdir(parents=True, exist_ok=True)
    for item in items_:
        if item.options is None:
            continue
        item.render().save(target / f"{item.id}.jpg", quality=95)
        others = [option for option in item.options if option != item.answer]
        record = {
            "question": item.question,
            "options": [item.answer, *others],
            "difficulty": item.difficulty,
            "box": list(item.box),
        }
        (target / f"{item.id}.json").write_text(json.dumps(record))


def write_pope(items_: list[SynthItem], path: Path) -> None:
    """POPE-format parquet: id, question_id, question, answer, image_source, category,
    image (a struct with the PNG bytes). Yes/no items only."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for index, item in enumerate(i for i in items_ if i.kind == "yesno"):
        buffer = io.BytesIO()
        item.render().save(buffer, format="PNG")
        rows.append(
            {
                "id": index,
                "question_id": item.id,
                "question": item.question,
                "answer": item.answer,
                "image_source": item.id,
                "category": item.difficulty,
                "image": {"bytes": buffer.getvalue(), "path": None},
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def describe(item: SynthItem) -> dict[str, object]:
    return asdict(item)
