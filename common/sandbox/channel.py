"""The host's end of a guest's output: every byte is hostile, every bound checked first.

The guest writes a JSON header line on its result channel (stdout), then the raw RGB
bytes of the images it hands back; what it prints goes to stderr. The host

- reads both pipes with caps (``collect``): over a cap or the wall clock, it stops
  reading and the sandbox is killed;
- takes the init's status record off the end (``split_status``): how the guest ended,
  written after the guest could write anything;
- parses the header (``parse``) within ``header_bytes``, refusing anything that is not
  the expected shape: nesting, types, the number of images, their pixels together,
  each image's size the model's view of the size it claims for its source (the grid's
  own size for it, its aspect ratio within the uploads' limit);
- takes the images' bytes only when their length is exactly what the header's sizes
  add up to, and builds the images from raw pixels: no file of the guest's is opened,
  no image format is decoded on this side;
- cleans every text (``clean_text``) before it reaches the model, the store, the API or
  a terminal: control characters but newline and tab removed, invalid UTF-8 and lone
  surrogates replaced.

Anything wrong raises ``BadReport``, whose message becomes the step's observation.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import selectors
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeGuard

from PIL import Image

from common.sandbox.guest.harness import READY_MARK, STATUS_MARK
from common.sandbox.guest.outputs import MOST_NOTES
from common.sandbox.guest.pixels import smart_resize

# control characters but newline and tab; the format characters (Unicode's Cf: the
# bidirectional overrides that make text display other than it reads, zero-width and
# invisible operators, tag characters), variation selectors, fillers and the combining
# grapheme joiner: invisible characters that can carry a hidden message
_CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u034f\u0600-\u0605\u061c\u06dd\u070f"
    "\u0890\u0891\u08e2\u115f\u1160\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0000-\U000e0fff]"
)
_SURROGATE = re.compile("[\ud800-\udfff]")
_LINE_SEPARATOR = re.compile("[\u2028\u2029\x85]")
_NOTE_CHARS = 300
_LONGEST_SIDE = 1 << 31  # (a side is a C int to Pillow; far longer than any image's)
STATUS_BYTES = len(STATUS_MARK) + 9  # the mark, eight hex digits, a newline


class BadReport(Exception):
    """The guest's report breaks the protocol (the message says how)."""


@dataclass(frozen=True)
class Grid:
    """The model's view of an image: Qwen-VL's resize rule (``factor``, ``min_pixels``,
    ``max_pixels``) on sources of at most ``max_aspect`` long side to short."""

    factor: int
    min_pixels: int
    max_pixels: int
    max_aspect: float

    def view(self, width: int, height: int) -> tuple[int, int] | None:
        """(width, height) the model sees a ``width`` x ``height`` source at; None for a
        shape it is not shown."""
        if max(width, height) > self.max_aspect * min(width, height):
            return None
        new_height, new_width = smart_resize(
            height, width, self.factor, self.min_pixels, self.max_pixels
        )
        return new_width, new_height


@dataclass(frozen=True)
class ReportLimits:
    """What a report may hold: ``header_bytes`` of JSON, ``text_chars`` of any text
    (``shown_chars`` of the text for the model), ``images`` images of ``pixels`` pixels
    together; with a ``grid``, each image the grid's view of the source it names."""

    header_bytes: int
    text_chars: int
    images: int
    pixels: int
    shown_chars: int | None = None
    grid: Grid | None = None


@dataclass(frozen=True)
class GuestReport:
    """What one execution handed back: images to show, else a text to show, else
    nothing (``error`` says why); what it printed; notes on images left out."""

    images: list[Image.Image] = field(default_factory=list)
    text: str | None = None
    printed: str = ""
    error: str | None = None
    notes: list[str] = field(default_factory=list)


Overrun = Literal["timeout", "output_limit", "cpu_limit"]
CHECK_EVERY_S = 0.1
# a guest trickling a few bytes at a time would keep this loop spinning on the worker's
# CPU: past FREE_SMALL_READS reads of under SMALL_READ bytes, wait THROTTLE_S before each
# next one (at most ~200 wake-ups a second, whatever the guest does)
SMALL_READ = 1 << 16
FREE_SMALL_READS = 64
THROTTLE_S = 0.005


def collect(
    process: subprocess.Popen[bytes],
    deadline: float,
    *,
    stdout_cap: int,
    stderr_cap: int,
    over_cpu: Callable[[], bool] = lambda: False,
    wall_s: float | None = None,
) -> tuple[bytearray, bytearray, Overrun | None]:
    """Read stdout and stderr until both close, the deadline passes, either exceeds its
    cap or ``over_cpu()`` (asked every ``CHECK_EVERY_S``) says the sandbox has spent its
    CPU time (the overrun is returned; the caller kills the sandbox).

    ``wall_s``: once stdout opens with the init's ``READY_MARK`` (the guest is ready for
    its code; the mark is taken off), the deadline becomes ``wall_s`` from then: a start
    that a busy machine made slow is not counted against the code."""
    assert process.stdout is not None and process.stderr is not None
    stdout = process.stdout.fileno()
    caps = {stdout: stdout_cap, process.stderr.fileno(): stderr_cap}
    received = {fd: bytearray() for fd in caps}  # (grown in place: no second copy)
    awaiting_ready = wall_s is not None
    small_reads = 0
    overrun: Overrun | None = None
    with selectors.DefaultSelector() as selector:
        for stream in (process.stdout, process.stderr):
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map() and overrun is None:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                overrun = "timeout"
                break
            if over_cpu():
                overrun = "cpu_limit"
                break
            for key, _ in selector.select(min(remaining, CHECK_EVERY_S)):
                data = os.read(key.fd, 1 << 20)
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                received[key.fd] += data
                if awaiting_ready and key.fd == stdout:
                    awaiting_ready = False
                    if received[stdout].startswith(READY_MARK):
                        del received[stdout][: len(READY_MARK)]
                        assert wall_s is not None
                        deadline = time.perf_counter() + wall_s
                if len(received[key.fd]) > caps[key.fd]:
                    overrun = "output_limit"
                small_reads += len(data) < SMALL_READ
            if small_reads > FREE_SMALL_READS:
                time.sleep(THROTTLE_S)  # a rate limit on the guest's wake-ups, not a wait
    out, err = received.values()
    return out, err, overrun


def split_status(stdout: bytearray) -> int | None:
    """Take the init's status record off the end of ``stdout`` (in place): the guest's
    wait status, or None where there is none (the sandbox was killed first) or it is not
    a status a process can end with (an exit code, or a signal)."""
    record = stdout[-STATUS_BYTES:]
    if len(record) != STATUS_BYTES or not record.startswith(STATUS_MARK):
        return None
    try:
        status = int(bytes(record[len(STATUS_MARK) : -1]), 16)
    except ValueError:
        return None
    exited = status & 0x7F == 0
    signalled = 0 < status & 0x7F < 0x7F and status >> 8 == 0
    if status > 0xFFFF or not (exited or signalled):
        return None
    del stdout[-STATUS_BYTES:]
    return status


def parse(stdout: bytes | bytearray, limits: ReportLimits) -> GuestReport:
    """The report on the result channel, checked field by field."""
    end = stdout.find(b"\n", 0, limits.header_bytes)
    if end < 0:
        raise BadReport(f"no report line within {limits.header_bytes} bytes")
    try:
        header = json.loads(bytes(stdout[:end]))
    except (ValueError, RecursionError) as exc:
        raise BadReport(f"the report is not valid JSON ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise BadReport("the report is not a JSON object")
    sizes = _image_sizes(header.get("images"), limits)
    images = _images(memoryview(stdout)[end + 1 :], sizes)
    notes = header.get("notes")
    if not isinstance(notes, list) or len(notes) > MOST_NOTES:
        raise BadReport(f"'notes' is not a list of at most {MOST_NOTES} texts")
    return GuestReport(
        images=images,
        text=_text(header, "text", limits, optional=True, limit=limits.shown_chars),
        printed=_text(header, "printed", limits) or "",
        error=_text(header, "error", limits, optional=True),
        notes=[clean_text(_string(note, "a note"), _NOTE_CHARS) for note in notes],
    )


def _image_sizes(value: Any, limits: ReportLimits) -> list[tuple[int, int, int, int]]:
    """(width, height, the source's width and height) of each image the header names."""
    if not isinstance(value, list) or len(value) > limits.images:
        raise BadReport(f"'images' is not a list of at most {limits.images}")
    sizes: list[tuple[int, int, int, int]] = []
    for item in value:
        width, height = _size(item, "width", "height")
        source = (width, height)
        if limits.grid is not None:
            source = _size(item, "source_width", "source_height")
            if limits.grid.view(*source) != (width, height):
                raise BadReport(
                    f"a {width}x{height} image is not the model's view of the "
                    f"{source[0]}x{source[1]} image it claims to show"
                )
        sizes.append((width, height, *source))
    if sum(width * height for width, height, *_ in sizes) > limits.pixels:
        raise BadReport(f"the images hold more than {limits.pixels} pixels together")
    return sizes


def _size(item: Any, *names: str) -> tuple[int, int]:
    width, height = (item.get(name) for name in names) if isinstance(item, dict) else (0, 0)
    if not (_side(width) and _side(height)):
        raise BadReport(f"an image's size is not two integers from 1 to {_LONGEST_SIDE - 1}")
    return width, height


def _side(value: Any) -> TypeGuard[int]:
    return type(value) is int and 0 < value < _LONGEST_SIDE


def _images(data: memoryview, sizes: list[tuple[int, int, int, int]]) -> list[Image.Image]:
    expected = sum(3 * width * height for width, height, *_ in sizes)
    if len(data) != expected:
        raise BadReport(f"{len(data)} bytes of pixels where the sizes say {expected}")
    images, offset = [], 0
    for width, height, *source in sizes:
        pixels = data[offset : offset + 3 * width * height]
        image = Image.frombytes("RGB", (width, height), pixels)
        image.info["pixels_sha256"] = hashlib.sha256(pixels).hexdigest()
        image.info["source_size"] = tuple(source)
        images.append(image)
        offset += len(pixels)
    return images


def _text(
    header: dict[str, Any],
    name: str,
    limits: ReportLimits,
    *,
    optional: bool = False,
    limit: int | None = None,
) -> str | None:
    value = header.get(name)
    if value is None and optional:
        return None
    return clean_text(
        _string(value, f"'{name}'"), min(limit or limits.text_chars, limits.text_chars)
    )


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise BadReport(f"{what} is not a text")
    return value


def clean_text(text: str, limit: int | None = None) -> str:
    """``text`` safe to show anywhere: no control characters but newline and tab (line
    separators become newlines), no invisible or format characters (``_CONTROL``), lone
    surrogates replaced (U+FFFD), at most ``limit`` characters."""
    if limit is not None:
        text = text[:limit]
    text = _LINE_SEPARATOR.sub("\n", text)
    return _CONTROL.sub("", _SURROGATE.sub("\ufffd", text))


def decode_text(data: bytes | bytearray, limit: int | None = None) -> str:
    """Bytes from the guest as clean text (invalid UTF-8 replaced)."""
    return clean_text(bytes(data).decode("utf-8", "replace"), limit)
