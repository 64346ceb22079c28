"""SpecEyes-Synth: a small generated world where tiny models can learn the real task.

Each item is an 896 x 896 image of two or three coloured shapes (each of another kind and
colour) on a lightly textured background, and a question about one of them, the target,
named by its kind. The shapes sit in a 4 x 4 grid of 224-pixel cells, one to a cell (a
small one in a quarter of its cell):

- **easy** items have a large target (128-208 px): readable at the small model's view
  (the image is shown at 128 px: 18-30 px, about a patch) and at the agent's (224 px);
- **hard** items have a small target (24-32 px): 3-5 px at the small model's view, too
  little of one patch to read, 6-8 px at the agent's, enough to see where it is, and
  2-3 patches after zooming into its cell (the cell is shown at 224 px).

The other shapes are always large, as the clutter around a small target in a
high-resolution photograph is: to answer, a model must pick the shape the question names
(and, on a hard item, find the one small shape and look closer).

Questions come in two kinds, as in the benchmarks: "What is the color of the <shape>?"
with four colour options (V* style), and "Is there a <color> <shape> in the image?"
(yes / no, POPE style, half of them yes; a "no" mostly names the colour of another shape
in the image). Everything is seeded and deterministic: the same seed gives the same
items, pixel for pixel.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
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
MARGIN = 8  # a large shape lies anywhere in its cell, this far from the cell's edges
# A small shape (a hard target) sits around the middle of a quarter of its cell (within
# JITTER px), which lies inside one patch of either model's view (patches of 56 and 112
# original px). Anywhere in the cell it was often cut by patch borders, and at the
# middle of the cell it always was, in four: the agent then told hard items from easy
# ones at chance after 10 minutes (100% within 4 minutes placed in a quarter).
JITTER = 8
QUARTERS = (CELL * 3 // 8, CELL * 5 // 8)  # 84 and 140 px into the cell
AGENT_VIEW = 224  # the tiny agent model's view of a SIZE x SIZE image (factor 28)
# The small model's view (factor 32). At 256 px it read hard targets (7-9 px) 87% of the
# time and was as sure of them as of easy ones: the gate had nothing to separate.
SMALL_VIEW = 128


@dataclass(frozen=True)
class Thing:
    """One shape in an image."""

    shape: str
    colour: str
    box: tuple[int, int, int, int]  # original pixels


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
    others: tuple[Thing, ...] = ()  # the other shapes in the image

    @property
    def things(self) -> tuple[Thing, ...]:
        """Every shape in the image, the target first."""
        return (Thing(self.shape, self.colour, self.box), *self.others)

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
    others: int | None = None,
) -> SynthItem:
    """The item of ``seed`` (its difficulty / kind drawn unless given). ``sizes`` overrides
    the target's size range and ``others`` the number of other shapes (training curricula
    only; the world never uses them)."""
    rng = random.Random(seed)
    difficulty = difficulty or rng.choice(("easy", "hard"))
    kind = kind or rng.choice(("choice", "yesno"))
    count = 1 + (rng.randint(1, len(SHAPES) - 1) if others is None else others)
    shapes = rng.sample(SHAPES, count)  # each of another kind: the kind names the target
    colours = rng.sample(list(COLOURS), count)
    cells = rng.sample(range(GRID * GRID), count)  # one shape to a cell
    target_sizes = sizes or (EASY_SIZES if difficulty == "easy" else HARD_SIZES)
    placed = []
    for index, (shape, colour, cell_index) in enumerate(zip(shapes, colours, cells, strict=True)):
        side = rng.randint(*(target_sizes if index == 0 else EASY_SIZES))
        row, col = divmod(cell_index, GRID)
        if side > CELL // 4:  # anywhere in its cell
            slack = CELL - side - 2 * MARGIN
            left = col * CELL + MARGIN + rng.randint(0, slack)
            top = row * CELL + MARGIN + rng.randint(0, slack)
        else:  # in a quarter of its cell, inside one patch of either model's view
            left, top = (
                offset * CELL + rng.choice(QUARTERS) - side // 2 + rng.randint(-JITTER, JITTER)
                for offset in (col, row)
            )
        placed.append(Thing(shape, colour, (left, top, left + side, top + side)))
    target = placed[0]
    row, col = divmod(cells[0], GRID)
    cell = (col * CELL, row * CELL, (col + 1) * CELL, (row + 1) * CELL)
    asked: str | None = None
    if kind == "choice":
        options = list(COLOURS)
        rng.shuffle(options)
        question, answer = f"What is the color of the {target.shape}?", target.colour
    else:
        options = None
        wrong = [c for c in COLOURS if c != target.colour]
        asked = target.colour if rng.random() < 0.5 else rng.choice(wrong)
        question = f"Is there a {asked} {target.shape} in the image?"
        answer = "yes" if asked == target.colour else "no"
    return SynthItem(
        f"synth-{seed}",
        seed,
        kind,
        difficulty,
        target.shape,
        target.colour,
        target.box,
        cell,
        question,
        options,
        answer,
        asked,
        tuple(placed[1:]),
    )


def items(
    count: int, seed: int = 0, *, hard_share: float | None = None, kind: str | None = None
) -> Iterator[SynthItem]:
    """``count`` items; item i uses its own seed, derived from (seed, i). ``hard_share``:
    of the same stream, the first hard and easy items in that proportion (a split that
    needs tools more or less often than the world's half, as V* does more than POPE);
    ``kind``: of the same stream, only items of that kind (a benchmark split holds one)."""
    wanted = None
    if hard_share is not None:
        hard = round(count * hard_share)
        wanted = {"hard": hard, "easy": count - hard}
    made, index = 0, 0
    while made < count:
        digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
        index += 1
        item = make_item(int.from_bytes(digest[:6], "big"))
        if kind is not None and item.kind != kind:
            continue
        if wanted is not None:
            if wanted[item.difficulty] == 0:
                continue
            wanted[item.difficulty] -= 1
        made += 1
        yield item


def render(item: SynthItem) -> Image.Image:
    """The item's image: textured light background, filled shapes."""
    rng = random.Random(item.seed ^ 0x5EED)
    base = rng.randint(200, 235)
    image = Image.new("RGB", (SIZE, SIZE), (base, base, base))
    draw = ImageDraw.Draw(image)
    for _ in range(400):  # light texture: faint grey specks
        x, y, r = rng.randrange(SIZE), rng.randrange(SIZE), rng.randint(2, 6)
        shade = base + rng.randint(-18, 18)
        draw.ellipse((x - r, y - r, x + r, y + r), fill=(shade, shade, shade))
    for thing in item.things:
        left, top, right, bottom = thing.box
        fill = COLOURS[thing.colour]
        if thing.shape == "circle":
            draw.ellipse((left, top, right - 1, bottom - 1), fill=fill)
        elif thing.shape == "square":
            draw.rectangle((left, top, right - 1, bottom - 1), fill=fill)
        else:
            corners = [((left + right) / 2, top), (left, bottom - 1), (right - 1, bottom - 1)]
            draw.polygon(corners, fill=fill)
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


def write_hr(items_: list[SynthItem], path: Path) -> None:
    """HR-Bench-format TSV: index, image (base64 JPEG), question, A-D, answer (a letter),
    category (the difficulty). Choice items only."""

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter="\t")
        writer.writerow(["index", "image", "question", "A", "B", "C", "D", "answer", "category"])
        for index, item in enumerate(i for i in items_ if i.options):
            buffer = io.BytesIO()
            item.render().save(buffer, format="JPEG", quality=95)
            image = base64.b64encode(buffer.getvalue()).decode()
            options = list(item.options or ())
            writer.writerow(
                [index, image, item.question, *options, item.answer_letter, item.difficulty]
            )
