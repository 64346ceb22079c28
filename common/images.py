"""Images in: load and validate, Qwen's smart resize, content hashes.

Loading checks the byte size and the pixel count *before* decoding (a small PNG can
declare a 50,000 x 50,000 canvas), applies the EXIF orientation, keeps the first frame of
an animation and converts every mode to RGB (transparency over white). The EXIF turn is
a setting (``images.exif_rotate``, on): the reference never turns an image. Anything that is
not a readable image raises ``ImageError`` with the reason; nothing here raises another
exception for bad bytes. The pixel limit is ours (``max_image_pixels``): Pillow's own
decompression-bomb check is switched off, since every decode here applies ours first.

Memory: a decoded image costs 3-4 bytes a pixel however small its file. A
``PixelBudget`` bounds what one process decodes at once (the API's uploads wait their
turn), and ``check_image`` validates a JPEG at 1/8 scale (the whole stream is still
decoded, so a truncated file is still caught).

``smart_resize`` is Qwen-VL's rule (both sides multiples of ``factor``, pixel count
clamped to [min_pixels, max_pixels], aspect ratio kept). transformers has the same
function, but importing it imports torch; this module must stay importable by the API
without torch, so the rule is restated (in ``common.sandbox.guest.pixels``, which the code
sandbox's guest shares: it resizes the images the code hands back itself) and a test
checks it against transformers.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, TypeVar

from PIL import Image, ImageOps, UnidentifiedImageError

from common.config import ImageSettings
from common.errors import ImageError
from common.sandbox.guest import pixels
from common.sandbox.guest.pixels import to_rgb

Image.MAX_IMAGE_PIXELS = None  # ours applies instead (decode_image), before any decode

# The evaluation resizes a benchmark image in the mode it was opened in (``reference_view``
# keeps what that needs, as marks a rule ``in_own_mode`` honours). Pillow resizes "1" and
# a palette image by nearest neighbour: marked ``NEAREST`` in its ``info`` (from a PNG
# text chunk of that name, or its own mode), which a crop keeps. An image with alpha
# (RGBA, LA) it resizes premultiplied and makes RGB after: marked ``ALPHA_FIRST``, it
# decodes to RGB as usual and holds its decoded alpha image (``_AlphaSource``, never
# read from a file). A file choosing its own mark chooses only how its own pixels are
# resized; the alpha image it then holds counts in ``image_pixels``.
RESAMPLE_MARK = "speceyes-resample"
NEAREST = "nearest"
ALPHA_FIRST = "alpha-first"
ALPHA_SOURCE = "speceyes-alpha-source"
_ALPHA_MODES = ("RGBA", "LA")
_WITH_SOURCE = 7 / 3  # an RGB image (3 bytes a pixel) and its RGBA source (4), in pixels


class _AlphaSource:
    """The alpha image one RGB image was decoded from. Pillow copies ``info`` into every
    image made from that one (a crop, a copy, an edit), whose pixels it is not: it
    answers for the image it was made for only. Neither pickled nor copied (it becomes
    None: the copy is resized as RGB)."""

    def __init__(self, owner: Image.Image, image: Image.Image) -> None:
        self._owner = weakref.ref(owner)
        self.image = image

    def of(self, image: Image.Image) -> Image.Image | None:
        return self.image if self._owner() is image else None

    def __reduce__(self) -> tuple[type[None], tuple[()]]:
        return type(None), ()


# Qwen2.5-VL (DeepEyes, Thyme): 14 px patches merged 2 x 2.
QWEN25_FACTOR = 28
QWEN25_MIN_PIXELS = 4 * 28 * 28
QWEN25_MAX_PIXELS = 16384 * 28 * 28


@dataclass(frozen=True)
class ResizeRule:
    """How a model's image processor resizes: ``factor`` = patch size x merge size;
    ``in_own_mode``: as the evaluation's own Pillow call resizes a benchmark image, in the
    mode it was opened in (its marks, above), not as a processor resizes RGB."""

    factor: int = QWEN25_FACTOR
    min_pixels: int = QWEN25_MIN_PIXELS
    max_pixels: int = QWEN25_MAX_PIXELS
    in_own_mode: bool = False

    def size_for(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) of an image of this size as the model sees it."""
        new_height, new_width = smart_resize(
            height, width, self.factor, self.min_pixels, self.max_pixels
        )
        return new_width, new_height

    def apply(
        self, image: Image.Image, box: tuple[int, int, int, int] | None = None
    ) -> Image.Image:
        """``image`` (or its ``box``, a crop) resized to the size the model sees it at,
        bicubic. ``in_own_mode``: by nearest neighbour where it is marked ``NEAREST``; an
        ``ALPHA_FIRST`` image from its alpha image, made RGB after the resize (crop it
        through ``box``: a crop made before has no alpha image and is resized as RGB)."""
        holder = image.info.get(ALPHA_SOURCE) if self.in_own_mode else None
        source = holder.of(image) if isinstance(holder, _AlphaSource) else None
        if source is not None:
            part = source if box is None else source.crop(box)
            size = self.size_for(*part.size)
            return reference_rgb(part if size == part.size else part.resize(size, _BICUBIC))
        region = image if box is None else image.crop(box)
        size = self.size_for(*region.size)
        if size == region.size:
            return region
        nearest = self.in_own_mode and region.info.get(RESAMPLE_MARK) == NEAREST
        return region.resize(size, Image.Resampling.NEAREST if nearest else _BICUBIC)

    def fetch(self, image: Image.Image) -> Image.Image:
        """``image`` as qwen_vl_utils' ``fetch_image`` resizes a file it opens (Thyme's
        agent is handed its image so): made RGB first, then resized bicubic."""
        return replace(self, in_own_mode=False).apply(image)


_BICUBIC = Image.Resampling.BICUBIC


def reference_rgb(image: Image.Image) -> Image.Image:
    """RGB as qwen_vl_utils' ``to_rgb`` makes it, which the evaluation's images pass
    through: RGBA pasted on white by its alpha, any other mode converted (an LA image's
    alpha dropped)."""
    if image.mode != "RGBA":
        return image.convert("RGB")
    canvas = Image.new("RGB", image.size, (255, 255, 255))
    canvas.paste(image, mask=image.getchannel("A"))
    return canvas


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Qwen-VL's target (height, width), by the SpecEyes evaluation's rule
    (``common.sandbox.guest.pixels.smart_resize``, where it is written out); an image with
    no pixels to enlarge is an ``ImageError``."""
    try:
        return pixels.smart_resize(height, width, factor, min_pixels, max_pixels)
    except ValueError as exc:
        raise ImageError(str(exc)) from None


def content_hash(data: bytes) -> str:
    """Stable identity of an image's bytes (hex sha256)."""
    return hashlib.sha256(data).hexdigest()


def keep_bytes(data: bytes, folder: Path, suffix: str) -> tuple[str, str]:
    """Keep image bytes under ``folder`` by content hash (``ab/abcd....png``), written
    atomically, once; returns (path, hash). Nothing is decoded."""
    digest = content_hash(data)
    target = folder / digest[:2] / f"{digest}{suffix}"
    _write_once(target, data)
    return str(target), digest


def _write_once(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` unless it exists, atomically: a reader sees the whole
    file or none."""
    if target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, scratch = tempfile.mkstemp(dir=target.parent, suffix=".part")
    with os.fdopen(handle, "wb") as out:
        out.write(data)
    os.replace(scratch, target)


ORIGINAL = ".original"  # beside a kept image: the file it was made from (``keep_original``)


def keep_original(kept: str, data: bytes) -> None:
    """Keep ``data``, the file an image kept at ``kept`` (``keep_bytes``) was made from,
    beside it: a V* file for Thyme, whose code is handed the file itself while the models
    see the kept image. Only we write such a name: no upload is kept under it."""
    _write_once(Path(kept).with_suffix(ORIGINAL), data)


def original_of(kept: str | None) -> bytes | None:
    """The file a kept image was made from (``keep_original``), or None; and None for
    one that is no image within the limits (a job may name an image beside which some
    other file lies: only an image, checked, goes on to a sandbox)."""
    if kept is None:
        return None
    try:
        data = read_image_bytes(Path(kept).with_suffix(ORIGINAL), ImageSettings())
        check_image(data, ImageSettings())
    except (OSError, ValueError, ImageError):
        return None
    return data


def image_suffix(data: bytes) -> str:
    """The file suffix of image bytes by their format (read from the header only)."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            return "." + (image.format or "img").lower()
    except Exception:  # unreadable bytes still get kept; decoding fails the job later
        return ".img"


def read_image_bytes(path: str | Path, limits: ImageSettings) -> bytes:
    """The bytes of an image file, refusing missing, empty and oversized files."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ImageError(f"image file not found: {path}", code="image_missing") from None
    except OSError as exc:
        raise ImageError(f"cannot read image file {path}: {exc.strerror}") from None
    if not path.is_file():
        raise ImageError(f"not a file: {path}")
    if size > limits.max_bytes:
        raise ImageError(
            f"image file is {size} bytes, above the limit of {limits.max_bytes}",
            code="image_too_large",
        )
    return path.read_bytes()


class PixelBudget:
    """At most ``limit`` pixels decoded at once in this process; a larger image waits
    until it is alone."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0  # the most held at once (for tests and metrics)
        self._changed = threading.Condition()

    @contextmanager
    def hold(self, pixels: int) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: self.held == 0 or self.held + pixels <= self.limit)
            self.held += pixels
            self.peak = max(self.peak, self.held)
        try:
            yield
        finally:
            with self._changed:
                self.held -= pixels
                self._changed.notify_all()


def image_pixels(path: str | Path | IO[bytes]) -> int:
    """The pixel count an image file declares (its header only), an ``ALPHA_FIRST`` one's
    with the alpha image it holds; 0 if it cannot be read (decoding it later gives the
    reason)."""
    try:
        with Image.open(path) as image:
            held = image.mode in _ALPHA_MODES and image.info.get(RESAMPLE_MARK) == ALPHA_FIRST
            return int(image.size[0] * image.size[1] * (_WITH_SOURCE if held else 1))
    except Exception:
        return 0


def decode_image(
    data: bytes, limits: ImageSettings, budget: PixelBudget | None = None
) -> Image.Image:
    """Decode and validate image bytes into an RGB image (first frame, EXIF-rotated)."""
    return _decode(data, limits, budget, draft=False)


def check_image(data: bytes, limits: ImageSettings, budget: PixelBudget | None = None) -> None:
    """Validate image bytes as ``decode_image`` does, at less memory: a JPEG is decoded at
    1/8 scale; the image is dropped."""
    _decode(data, limits, budget, draft=True)


def _decode(
    data: bytes, limits: ImageSettings, budget: PixelBudget | None, *, draft: bool
) -> Image.Image:
    if not data:
        raise ImageError("image is empty (0 bytes)")
    if len(data) > limits.max_bytes:
        raise ImageError(
            f"image is {len(data)} bytes, above the limit of {limits.max_bytes}",
            code="image_too_large",
        )
    try:
        opened = Image.open(io.BytesIO(data))
        width, height = opened.size
        if width * height > limits.max_pixels:
            raise ImageError(
                f"image is {width}x{height} = {width * height} pixels, above the limit "
                f"of {limits.max_pixels}",
                code="image_too_many_pixels",
            )
        aspect = max(width, height) / max(1, min(width, height))
        if aspect > limits.max_aspect_ratio:
            raise ImageError(
                f"image is {width}x{height}: its aspect ratio {aspect:.0f}:1 is above the "
                f"limit of {limits.max_aspect_ratio:g}:1 (the models' image processor "
                "refuses more)",
                code="image_aspect_ratio",
            )
        if draft and opened.format == "JPEG":
            opened.draft(opened.mode, (max(1, width // 8), max(1, height // 8)))
        decoded = opened.size[0] * opened.size[1]  # (a draft's smaller size)
        mark = opened.info.get(RESAMPLE_MARK)  # (from the header, as image_pixels reads it)
        with budget.hold(decoded) if budget else nullcontext():
            opened.seek(0)  # animated: the first frame
            opened.load()
            if draft:  # a check only: the orientation and colours change nothing
                return opened
            if limits.exif_rotate:
                ImageOps.exif_transpose(opened, in_place=True)  # (no second copy)
            if mark == ALPHA_FIRST and opened.mode in _ALPHA_MODES:
                rgb = reference_rgb(opened)
                rgb.info[ALPHA_SOURCE] = _AlphaSource(rgb, opened)
                return rgb
            rgb = to_rgb(opened)
            if opened.mode == "1" or mark == NEAREST:
                rgb.info[RESAMPLE_MARK] = NEAREST
            return rgb
    except ImageError:
        raise
    except UnidentifiedImageError:
        raise ImageError("not an image, or an unsupported image format") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ImageError(f"corrupt or truncated image: {exc}") from None


def load_image(path: str | Path, limits: ImageSettings | None = None) -> tuple[Image.Image, str]:
    """Read, validate and decode an image file; returns (RGB image, content hash)."""
    limits = limits or ImageSettings()
    data = read_image_bytes(path, limits)
    return decode_image(data, limits), content_hash(data)


# Formats a preview is written back in (the decoded file's own); anything else as PNG.
_PREVIEW_FORMATS = {"JPEG": "image/jpeg", "PNG": "image/png", "WEBP": "image/webp"}


def render_image(
    data: bytes,
    limits: ImageSettings,
    *,
    max_side: int | None = None,
    box: Sequence[int] | None = None,
    budget: PixelBudget | None = None,
) -> tuple[bytes, str]:
    """An image's bytes as a person is shown them: decoded as the models saw it (validated,
    first frame, EXIF-rotated; within ``budget``'s pixels at once), cut to ``box``
    ([x1, y1, x2, y2] in those pixels, corners in any order) and scaled to fit
    ``max_side``; encoded in its own format where that is JPEG, PNG or WebP, else PNG.
    Returns (bytes, media type). Nothing of the file passes unparsed; whatever is wrong
    with it is an ``ImageError``."""
    image = decode_image(data, limits, budget)  # an ImageError for anything not an image
    with Image.open(io.BytesIO(data)) as probe:  # decoded above: this reads its header
        source_format = probe.format or ""
    if box is not None:
        x1, x2 = sorted(max(0, min(int(v), image.width)) for v in (box[0], box[2]))
        y1, y2 = sorted(max(0, min(int(v), image.height)) for v in (box[1], box[3]))
        image = image.crop((x1, y1, max(x2, x1 + 1), max(y2, y1 + 1)))
    if max_side is not None and max(image.size) > max_side:
        image.thumbnail((max_side, max_side))
    out_format = source_format if source_format in _PREVIEW_FORMATS else "PNG"
    image.info.clear()  # no profile, comment or metadata of the file passes on
    buffer = io.BytesIO()
    image.save(buffer, format=out_format, **({"quality": 90} if out_format == "JPEG" else {}))
    return buffer.getvalue(), _PREVIEW_FORMATS[out_format]


def image_size(path: str | Path | IO[bytes], *, rotate: bool = True) -> tuple[int, int]:
    """(width, height) of an image file as the models see it: from its header, swapped
    where its EXIF orientation turns it a quarter (and ``rotate``, the loader's
    ``images.exif_rotate``). ``ImageError`` if it cannot be read."""
    try:
        with Image.open(path) as image:
            width, height = image.size
            orientation = image.getexif().get(0x0112, 1)  # EXIF Orientation
    except (OSError, SyntaxError, ValueError, EOFError) as exc:  # what Pillow raises
        raise ImageError(f"cannot read the image's header: {exc}") from None
    return (height, width) if rotate and orientation in (5, 6, 7, 8) else (width, height)


T = TypeVar("T")


def budget_groups(items: Sequence[T], pixels_of: Callable[[T], int], budget: int) -> list[list[T]]:
    """``items`` in order, in groups whose pixels (``pixels_of`` each) add up to at most
    ``budget`` (a group holds one item at least: one over the budget stands alone)."""
    groups: list[list[T]] = []
    held = budget  # start a new group at the first item
    for item in items:
        pixels = pixels_of(item)
        if held + pixels > budget or not groups:
            groups.append([])
            held = 0
        groups[-1].append(item)
        held += pixels
    return groups
