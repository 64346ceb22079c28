"""The paper's benchmarks as ``annotate`` sources, in their published layouts.

- **V\\***: a folder with ``direct_attributes/`` and / or ``relative_position/`` (or one of
  them), each ``NAME.jpg`` beside ``NAME.json`` = ``{"question", "options"}``, the correct
  option first. The options are shown in that order, lettered A, B, ... (as the
  reference evaluation shows them), so the right answer is always A.
- **HR-Bench**: a ``.tsv`` with columns ``image`` (base64), ``question``, ``A``-``D``,
  ``answer`` (a letter) and ``category`` (others, such as ``index``, are ignored).
- **POPE**: a ``.parquet`` with ``question``, ``answer`` (yes / no), ``category``,
  ``question_id`` and ``image`` (a struct with ``bytes``), or a folder holding
  ``Full/{adversarial,popular,random}-*.parquet``.

Every row keeps its split (``vstar/direct_attributes``, ``hr/hr_bench_4k``,
``pope/random``), its category and its expected answer. Images inside a TSV or parquet
file are kept like uploads, by content hash under ``image_store``; the file is read a
row (TSV) or a small record batch (parquet) at a time, so an HR-Bench 8K file (800
images of ~8K pixels) is never held whole, and no image is decoded here, except for a
Thyme run: the evaluation of Thyme shows every phase HR-Bench's and POPE's images as
the quality-95 JPEG it writes for the code, so those are kept as that JPEG
(``thyme_jpeg``), one image at a time.
"""

from __future__ import annotations

import base64
import binascii
import csv
import io
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, PngImagePlugin

from common.config import ImageSettings
from common.contracts import SourceRow
from common.errors import ImageError, InvalidInput
from common.images import (
    ALPHA_FIRST,
    NEAREST,
    RESAMPLE_MARK,
    image_suffix,
    keep_bytes,
    keep_original,
    reference_rgb,
)
from common.protocols.thyme import HR_PATH as THYME_HR_PATH
from common.protocols.thyme import JPEG_QUALITY as THYME_JPEG_QUALITY
from common.protocols.thyme import POPE_PATH as THYME_POPE_PATH
from common.protocols.thyme import VSTAR_PATH as THYME_VSTAR_PATH

Benchmark = Literal["vstar", "hr", "pope"]
VSTAR_SPLITS = ("direct_attributes", "relative_position")
HR_OPTIONS = ("A", "B", "C", "D")


def detect(source: Path) -> Benchmark | None:
    """Which benchmark layout ``source`` has, if any."""
    if source.is_dir():
        if any((source / split).is_dir() for split in VSTAR_SPLITS) or (
            source.name in VSTAR_SPLITS and any(source.glob("*.json"))
        ):
            return "vstar"
        if any((source / "Full").glob("*.parquet")):
            return "pope"
        return None
    suffix = source.suffix.lower()
    if suffix == ".tsv":
        return "hr"
    return "pope" if suffix == ".parquet" and _pope_columns(source) else None


# A Parquet file is POPE's (lmms-lab/POPE) when it has POPE's columns; any other is a
# table with an image column (``common.sources.hfdata``).
POPE_COLUMNS = {"question_id", "question", "answer", "image", "category"}


def _pope_columns(path: Path) -> bool:
    try:
        return set(pq.read_schema(path).names) >= POPE_COLUMNS
    except (OSError, pa.ArrowException):
        return False


def read_benchmark(source: Path, image_store: Path, *, for_thyme: bool = False) -> list[SourceRow]:
    """The rows of a benchmark source (``detect`` said which). ``for_thyme``: HR-Bench's
    and POPE's images are kept as the evaluation of Thyme writes them before any phase
    sees them (``thyme_jpeg``); V*'s files are its own either way."""
    kind = detect(source)
    if kind == "vstar":
        keep = _Keeper(image_store, False, "vstar")
        rows = read_vstar(source)
        if for_thyme:
            rows = [replace(row, shown_path=_vstar_shown(row)) for row in rows]
        return [_as_seen(row, keep, keep_file=for_thyme) for row in rows]
    if kind == "hr":
        return list(_numbered(_hr_rows(source, _Keeper(image_store, for_thyme, "hr"))))
    if kind == "pope":
        keep = _Keeper(image_store, for_thyme, "pope")
        files = sorted((source / "Full").glob("*.parquet")) if source.is_dir() else [source]
        return list(_numbered(row for path in files for row in _pope_rows(path, keep)))
    raise InvalidInput(f"{source} is not a V*, HR-Bench or POPE source")


def read_vstar(folder: Path) -> list[SourceRow]:
    splits = [folder] if folder.name in VSTAR_SPLITS else [folder / s for s in VSTAR_SPLITS]
    rows: list[SourceRow] = []
    for split_folder in (split for split in splits if split.is_dir()):
        split = f"vstar/{split_folder.name}"
        for record_path in sorted(split_folder.glob("*.json")):
            item_id = f"{split_folder.name}/{record_path.stem}"
            image = record_path.with_suffix(".jpg")
            try:
                record = json.loads(record_path.read_text(encoding="utf-8"))
                question, options = str(record["question"]), [str(o) for o in record["options"]]
            except (ValueError, KeyError, TypeError) as exc:
                reason = f"{record_path.name}: not a V* record ({type(exc).__name__}: {exc})"
                rows.append(_broken(len(rows), item_id, reason, split))
                continue
            error = None if image.is_file() else ("image_missing", f"{image} not found")
            rows.append(
                SourceRow(
                    len(rows),
                    item_id,
                    question,
                    options,
                    str(image.resolve()),
                    error,
                    expected=options[0] if options else None,
                    split=split,
                )
            )
    if not rows:
        raise InvalidInput(f"no V* items in {folder} (NAME.json + NAME.jpg per item)")
    return rows


def _hr_rows(path: Path, keep: _Keeper) -> Iterator[SourceRow]:
    csv.field_size_limit(sys.maxsize)  # a base64 8K image is one field of many MB
    split = f"hr/{path.stem}"
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle, delimiter="\t")
        missing = {"image", "question", "answer", *HR_OPTIONS} - set(reader.fieldnames or ())
        if missing:
            raise InvalidInput(f"{path} is not an HR-Bench TSV: no {', '.join(sorted(missing))}")
        for number, record in enumerate(reader):
            item_id = f"{path.stem}/{record.get('index') or number}"
            options = [record[letter] for letter in HR_OPTIONS]
            stored = keep.base64(record["image"])
            shown = THYME_HR_PATH.format(split=path.stem, index=number)
            row = SourceRow(
                0,
                item_id,
                record["question"],
                options,
                split=split,
                category=record.get("category") or None,
                expected=(record["answer"] or "").strip() or None,
                shown_path=shown if keep.for_thyme else None,
            )
            yield _with_image(row, stored)


def _pope_rows(path: Path, keep: _Keeper) -> Iterator[SourceRow]:
    split = f"pope/{path.stem.split('-')[0]}"
    columns = ["question", "answer", "image", "question_id", "category"]
    parquet = pq.ParquetFile(path)
    present = [column for column in columns if column in parquet.schema_arrow.names]
    if not {"question", "answer", "image"} <= set(present):
        raise InvalidInput(f"{path} is not a POPE parquet file (question, answer, image)")
    number = 0
    for batch in parquet.iter_batches(batch_size=32, columns=present):
        for record in batch.to_pylist():
            item_id = f"{path.stem.split('-')[0]}/{record.get('question_id') or number}"
            shown = THYME_POPE_PATH.format(split=split.split("/")[1], index=number)
            number += 1
            row = SourceRow(
                0,
                item_id,
                str(record["question"]),
                None,
                split=split,
                category=record.get("category") or None,
                expected=str(record["answer"]).strip() or None,
                shown_path=shown if keep.for_thyme else None,
            )
            yield _with_image(row, keep.struct(record["image"]))


class _Keeper:
    """Keeps a benchmark file's images in ``image_store`` by content hash: as they come
    where our loader decodes them as the reference does (``reference_view``), else as a
    PNG of the reference's pixels; or (``for_thyme``) as the evaluation of Thyme writes
    them (``thyme_jpeg``)."""

    def __init__(self, image_store: Path, for_thyme: bool, kind: str) -> None:
        self.image_store, self.for_thyme, self.kind = image_store, for_thyme, kind

    def base64(self, text: str) -> tuple[str, str] | str:
        """(path, hash) of a base64 image kept, or why it could not be."""
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            return "the image column is not valid base64"
        return self.bytes(data) if data else "the image is empty"

    def struct(self, image: Any) -> tuple[str, str] | str:
        data = image.get("bytes") if isinstance(image, dict) else None
        return self.bytes(data) if data else "the image struct has no bytes"

    def bytes(self, data: bytes) -> tuple[str, str] | str:
        try:
            data = thyme_jpeg(data) if self.for_thyme else reference_view(data, self.kind)
        except ImageError as exc:
            return str(exc)
        return keep_bytes(data, self.image_store, image_suffix(data))


def _vstar_shown(row: SourceRow) -> str | None:
    """A V* row's image path as Thyme's evaluation names it (its split folder and file
    name under the default ``data/vstar``)."""
    if row.image_path is None or row.split is None:
        return None
    name = row.item_id.split("/", 1)[1] + ".jpg"  # the file's own name, links not followed
    return THYME_VSTAR_PATH.format(split=row.split.split("/")[1], name=name)


def _as_seen(row: SourceRow, keep: _Keeper, *, keep_file: bool = False) -> SourceRow:
    """A V* row whose file our loader would decode otherwise than the reference (an EXIF
    turn, a palette's transparency) points at a kept PNG of the reference's pixels;
    ``keep_file`` (Thyme): with the file itself beside it (``keep_original``), which
    Thyme's evaluation hands to the model's code as it is."""
    if row.error is not None or row.image_path is None or not _differs(row.image_path):
        return row
    try:
        data = Path(row.image_path).read_bytes()
    except OSError:
        return row  # (reported as the job's own error when it is loaded)
    stored = keep.bytes(data)
    if keep_file and not isinstance(stored, str):
        keep_original(stored[0], data)
    return _with_image(row, stored)


_KEPT_MODES = ("RGB", "L", "CMYK", "YCbCr", "1")  # to RGB alike, ours and the reference's


def _differs(image: str | Path | io.BytesIO) -> bool:
    """Whether our loader would decode this image otherwise than the reference: it has an
    EXIF orientation (we turn it, the reference never does) or a mode with transparency
    or a palette (we compose transparency on white; the reference converts)."""
    try:
        with Image.open(image) as opened:
            turned = opened.getexif().get(0x0112, 1) not in (None, 1)  # EXIF Orientation
            return turned or opened.mode not in _KEPT_MODES
    except (OSError, SyntaxError, ValueError, EOFError):
        return False  # (not an image: the loader says why)


def reference_view(data: bytes, kind: str, limits: ImageSettings | None = None) -> bytes:
    """A benchmark image as the DeepEyes evaluation's models see it, where our loader would
    decode it otherwise (``_differs``): never turned by its EXIF orientation; HR-Bench's
    RGBA and P converted to RGB first (``decode_base64_to_image``), then everything as
    qwen_vl_utils' ``to_rgb`` makes it (``images.reference_rgb``), kept as a lossless PNG
    our loader decodes to those pixels. Other images as they are. The evaluation resizes
    every image (and crop) before ``to_rgb``, in the mode it was opened in. Pillow
    resizes V*'s and POPE's palette images, and every bilevel one, by nearest neighbour
    whatever it is asked: the PNG is marked so (``RESAMPLE_MARK``), and the model's view
    and crops of it are resized that way (converting and picking pixels commute: the
    same pixels). An image with alpha (RGBA, LA) is resized with it, premultiplied: the
    PNG keeps it, marked ``ALPHA_FIRST``, and the model's views of it are made so."""
    if not _differs(io.BytesIO(data)):
        return data
    with _pillow_errors("read as the evaluation reads it"):
        image = _opened(data, limits)
        nearest = image.mode == "1" or (image.mode == "P" and kind != "hr")
        if kind == "hr" and image.mode in ("RGBA", "P"):
            image = image.convert("RGB")
        marks = PngImagePlugin.PngInfo()
        if nearest:
            marks.add_text(RESAMPLE_MARK, NEAREST)
        if image.mode in ("RGBA", "LA"):  # kept with its alpha, resized before to_rgb
            marks.add_text(RESAMPLE_MARK, ALPHA_FIRST)
        else:
            image = reference_rgb(image)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", pnginfo=marks)
    return buffer.getvalue()


def thyme_jpeg(data: bytes, limits: ImageSettings | None = None) -> bytes:
    """An HR-Bench or POPE image as the evaluation of Thyme writes it before showing it to
    any phase (``eval_code_thyme/SpecEyes.py``: ``decode_base64_to_temp_image`` and the
    POPE loader): RGBA and P converted to RGB, other modes as they are, no EXIF turn,
    saved as a JPEG at quality 95. ``ImageError`` for what cannot be (a broken image, one
    over the pixel limit, a mode JPEG cannot hold)."""
    with _pillow_errors("saved as the evaluation saves it"):
        image = _opened(data, limits)
        if image.mode in ("RGBA", "P"):
            image = image.convert("RGB")
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=THYME_JPEG_QUALITY)
    return buffer.getvalue()


def _opened(data: bytes, limits: ImageSettings | None) -> Image.Image:
    """The image ``data`` holds, decoded as it is (its mode, no EXIF turn), once its size
    is within the pixel limit."""
    limits = limits or ImageSettings()
    with Image.open(io.BytesIO(data)) as opened:
        width, height = opened.size
        if width * height > limits.max_pixels:
            raise ImageError(f"image is {width}x{height}, above the pixel limit")
        return opened.copy()


@contextmanager
def _pillow_errors(doing: str) -> Iterator[None]:
    """What Pillow raises on a broken image, as an ``ImageError``: it "cannot be {doing}"."""
    try:
        yield
    except ImageError:
        raise
    except (OSError, SyntaxError, ValueError, EOFError) as exc:  # what Pillow raises
        raise ImageError(f"the image cannot be {doing}: {exc}") from None


def _with_image(row: SourceRow, stored: tuple[str, str] | str) -> SourceRow:
    if isinstance(stored, str):
        return replace(row, error=("image_invalid", f"{row.item_id}: {stored}"))
    return replace(row, image_path=stored[0], image_hash=stored[1])


def _numbered(rows: Iterator[SourceRow]) -> Iterator[SourceRow]:
    for position, row in enumerate(rows):
        yield replace(row, position=position)


def _broken(position: int, item_id: str, reason: str, split: str) -> SourceRow:
    return SourceRow(position, item_id, "", error=("invalid_input", reason), split=split)
