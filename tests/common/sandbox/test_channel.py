"""The host's reading of a guest's report, and the guest's reading of its own printed
paths: every malformed report is one ``BadReport``, every text comes out clean, and the
linear path scan finds exactly what the evaluation's regex finds."""

from __future__ import annotations

import dataclasses
import json
import random
import re
import subprocess
import sys
import time
import unicodedata

import pytest
from PIL import Image

from common.sandbox.channel import (
    BadReport,
    Grid,
    ReportLimits,
    clean_text,
    collect,
    decode_text,
    parse,
    split_status,
)
from common.sandbox.guest.harness import READY_MARK, STATUS_MARK
from common.sandbox.guest.outputs import MOST_NOTES, frames, printed_paths

LIMITS = ReportLimits(header_bytes=4096, text_chars=100, images=2, pixels=1000)
EMPTY = {"images": [], "text": None, "printed": "", "error": None, "notes": []}


def report(header: object, pixels: bytes = b"") -> bytes:
    return json.dumps(header).encode() + b"\n" + pixels


def test_a_well_formed_report_gives_its_images_from_raw_pixels():
    pixels = bytes(range(2 * 3 * 3)) + bytes(3 * 3 * 3)
    header = {**EMPTY, "images": [{"width": 2, "height": 3}, {"width": 3, "height": 3}]}
    parsed = parse(report(header, pixels), LIMITS)
    assert [image.size for image in parsed.images] == [(2, 3), (3, 3)]
    assert parsed.images[0].getpixel((1, 0)) == (3, 4, 5)
    assert len(parsed.images[0].info["pixels_sha256"]) == 64


@pytest.mark.parametrize(
    ("stdout", "said"),
    [
        (b"", "no report line"),
        (b"\n", "not valid JSON"),  # (an empty report line is one)
        (b"x" * 5000 + b"\n", "no report line within 4096"),
        (b"[" * 2000 + b"]" * 2000 + b"\n", "not valid JSON (RecursionError)"),
        (b"\xff\xfe\n", "not valid JSON"),
        (report([1, 2]), "not a JSON object"),
        (report({**EMPTY, "images": [{"width": 1, "height": 1}] * 3}), "at most 2"),
        (report({**EMPTY, "images": {"width": 1}}), "at most 2"),
        (report({**EMPTY, "images": [{"width": True, "height": 1}]}, b"xxx"), "integers from 1"),
        (report({**EMPTY, "images": [{"width": 0, "height": 5}]}), "integers from 1"),
        (report({**EMPTY, "images": [[1, 1]]}), "integers from 1"),
        (report({**EMPTY, "images": [{"width": 100, "height": 11}]}), "1000 pixels together"),
        (report({**EMPTY, "images": [{"width": 2, "height": 2}]}, b"x" * 11), "say 12"),
        (report(EMPTY, b"trailing"), "8 bytes of pixels where the sizes say 0"),
        (report({**EMPTY, "printed": None}), "'printed' is not a text"),
        (report({**EMPTY, "text": 5}), "'text' is not a text"),
        (report({**EMPTY, "notes": ["x"] * 9}), "'notes'"),
        (report({**EMPTY, "notes": [1]}), "a note is not a text"),
    ],
)
def test_a_malformed_report_is_one_clear_error(stdout, said):
    with pytest.raises(BadReport, match=re.escape(said)):
        parse(stdout, LIMITS)


def test_texts_come_out_clean_and_bounded():
    header = {
        **EMPTY,
        "text": "\x1b[2Jred\x00\r\x07\x9b" + "y" * 200,
        "printed": "a\tb\nc\ud800",
        "error": "\udfff",
        "notes": ["\x1b]0;title\x07note"],
    }
    parsed = parse(report(header), LIMITS)
    assert parsed.text == "[2Jred" + "y" * 89  # cut at 100 characters, then cleaned
    assert parsed.printed == "a\tb\nc\ufffd" and parsed.error == "\ufffd"
    assert parsed.notes == ["]0;titlenote"]
    # text that displays other than it reads, or hides ASCII from people
    assert clean_text("abc\u202edcba\u2066x\u2069\U000e0041\U000e0042") == "abcdcbax"
    assert clean_text("one\u2028two\u2029three\x85four") == "one\ntwo\nthree\nfour"
    assert clean_text("zero\u200bwidth") == "zerowidth"
    assert decode_text(b"\xff\x1b[0mok") == "\ufffd[0mok"


def test_every_format_character_and_variation_selector_is_removed():
    hidden = "".join(
        chr(c)
        for c in range(0x110000)
        if unicodedata.category(chr(c)) == "Cf" or 0xFE00 <= c <= 0xFE0F or 0xE0100 <= c <= 0xE01EF
    )
    assert len(hidden) > 300 and clean_text(f"a{hidden}b") == "ab"


def test_the_text_for_the_model_has_its_own_cap():
    shown = ReportLimits(header_bytes=4096, text_chars=100, images=2, pixels=1000, shown_chars=10)
    parsed = parse(report({**EMPTY, "text": "t" * 50, "printed": "p" * 50}), shown)
    assert parsed.text == "t" * 10 and parsed.printed == "p" * 50


def _regex_paths(printed: str, prefix: str) -> list[str]:
    extensions = r"\.(?:jpg|jpeg|png|bmp|gif|tiff))"
    return re.findall(rf"({re.escape(prefix)}[^\s\'\"]+" + extensions, printed)


@pytest.mark.parametrize("prefix", ["", "/d/o"])
def test_the_path_scan_finds_what_the_evaluations_regex_finds(prefix):
    pieces = [
        "/d/o",
        "/d/o/",
        "a",
        ".",
        ".png",
        ".jpg",
        ".jpeg",
        "jpeg",
        ".tiff",
        " ",
        "'",
        '"',
        "\n",
        "x.gif",
        "..",
        "/",
        "é",
    ]
    chooser = random.Random(7)
    for _ in range(3000):
        printed = "".join(chooser.choice(pieces) for _ in range(chooser.randrange(12)))
        assert printed_paths(printed, prefix) == _regex_paths(printed, prefix), printed


def test_the_path_scan_is_linear_where_the_regex_backtracks():
    # 200,000 path characters with no extension: the regex tries every start against the
    # whole run (~10^10 steps); the scan looks once from the right
    printed = "/d/o/x" * 40_000
    assert printed_paths(printed, "/d/o") == [] and printed_paths(printed) == []


GRID = Grid(factor=28, min_pixels=4 * 28 * 28, max_pixels=16384 * 28 * 28, max_aspect=200)
ON_GRID = ReportLimits(header_bytes=4096, text_chars=100, images=4, pixels=200_000, grid=GRID)


def _sized(width: int, height: int, source: tuple[int, int]) -> dict[str, int]:
    return {"width": width, "height": height, "source_width": source[0], "source_height": source[1]}


def test_an_image_on_the_grid_is_taken_with_the_size_the_code_saved():
    header = {**EMPTY, "images": [_sized(112, 56, (100, 50))]}
    parsed = parse(report(header, bytes(3 * 112 * 56)), ON_GRID)
    assert parsed.images[0].size == (112, 56)
    assert parsed.images[0].info["source_size"] == (100, 50)


@pytest.mark.parametrize(
    ("image", "said"),
    [
        # the thin attack forged: a 10,000,000 x 1 source is no view at all (its aspect)
        (_sized(11_333_588, 28, (10_000_000, 1)), "not the model's view"),
        # a view of a size the grid never gives (not a multiple of 28)
        (_sized(100, 50, (100, 50)), "a 100x50 image is not the model's view of the 100x50"),
        (_sized(56, 56, (30, 40)), "not the model's view of the 30x40 image it claims"),
        # the right shape for its source, but over what the trajectory may be shown
        (_sized(3584, 3584, (3584, 3584)), "200000 pixels together"),
        # sides Pillow could not hold, or arithmetic could not take
        (_sized(28, 28, (10**40, 1)), "integers from 1"),
        ({"width": 28, "height": 28}, "integers from 1"),
    ],
)
def test_an_image_off_the_grid_or_over_the_budget_is_refused(image, said):
    with pytest.raises(BadReport, match=re.escape(said)):
        parse(report({**EMPTY, "images": [image]}, bytes(3 * 28 * 28)), ON_GRID)


def test_the_inits_status_record_comes_off_the_end():
    out = bytearray(report(EMPTY) + STATUS_MARK + b"%08x\n" % (137 << 8))
    assert split_status(out) == 137 << 8 and parse(out, LIMITS).error is None
    forged_then_cut = bytearray(report(EMPTY) + STATUS_MARK + b"zzzzzzzz\n")
    assert split_status(forged_then_cut) is None
    assert split_status(bytearray(b"")) is None


def test_the_guest_resizes_to_the_grid_as_the_host_would(tmp_path):
    from common.protocols import THYME

    source = Image.effect_mandelbrot((1000, 700), (-2, -1.2, 1, 1.2), 60).convert("RGB")
    source.save(tmp_path / "a.png")
    view = {**dataclasses.asdict(GRID), "pixels": 10**7}
    sizes, data, notes = frames(
        [str(tmp_path / "a.png")], most=4, pixels=10**7, file_bytes=1 << 24, view=view
    )
    shown = THYME.view(source)
    assert notes == [] and sizes == [_sized(*shown.size, source.size)]
    assert data == [shown.tobytes()]  # byte for byte what the host's view gives


def test_the_guest_leaves_out_thin_and_over_budget_images_and_caps_its_notes(tmp_path):
    Image.new("RGB", (4000, 10)).save(tmp_path / "thin.png")  # aspect 400
    Image.new("RGB", (560, 560)).save(tmp_path / "big.png")  # 400 tokens
    Image.new("RGB", (280, 280)).save(tmp_path / "fits.png")  # 100 tokens
    paths = [str(tmp_path / n) for n in ("thin.png", "big.png", "fits.png")]
    paths += [str(tmp_path / f"missing{i}.png") for i in range(9)]
    view = {**dataclasses.asdict(GRID), "pixels": 300 * 28 * 28}
    sizes, _, notes = frames(paths, most=4, pixels=10**7, file_bytes=1 << 24, view=view)
    assert [size["width"] for size in sizes] == [280]
    assert "aspect ratio is over 200" in notes[0]
    assert "400 visual tokens, over the 300" in notes[1]
    assert len(notes) == MOST_NOTES and notes[-1] == "4 more image(s) left out"
    parse(report({**EMPTY, "notes": notes}), LIMITS)  # a genuine report is never refused


@pytest.mark.parametrize(("after_ready_s", "overrun"), [(0.3, None), (1.5, "timeout")])
def test_the_wall_clock_counts_from_the_guest_being_ready(after_ready_s, overrun):
    """A start a busy machine made slow (1.2 s, over a wall clock of 1 s) is not counted:
    the code's time is, from the init's ready mark (which is taken off)."""
    script = (
        "import sys, time\ntime.sleep(1.2)\n"
        f"sys.stdout.buffer.write({READY_MARK!r}); sys.stdout.flush()\n"
        f"time.sleep({after_ready_s})\nprint('done')"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, _, got = collect(
            process, time.perf_counter() + 1.0 + 30, stdout_cap=1000, stderr_cap=1000, wall_s=1.0
        )
    finally:
        process.kill()
        process.wait()
    assert got == overrun and (overrun or bytes(out) == b"done\n")


def test_images_of_exactly_the_pixel_budget_are_taken():
    header = {**EMPTY, "images": [{"width": 100, "height": 10}]}  # 1000: the budget
    assert parse(report(header, bytes(3 * 1000)), LIMITS).images[0].size == (100, 10)


def test_a_side_is_refused_with_the_exact_bound_it_broke():
    bad = report({**EMPTY, "images": [{"width": 2**31, "height": 1}]})
    with pytest.raises(BadReport, match=r"integers from 1 to 2147483647$"):
        parse(bad, LIMITS)


def test_a_note_is_cut_at_300_characters():
    parsed = parse(report({**EMPTY, "notes": ["n" * 400]}), LIMITS)
    assert parsed.notes == ["n" * 300]


@pytest.mark.parametrize(
    ("status", "taken"),
    [
        (9, 9),  # killed by SIGKILL
        (31 | 0x80, 31 | 0x80),  # SIGSYS, with a core
        (0x7F, None),  # "stopped", not an end
        (0x017F, None),  # stopped by a signal
        (0x0105, None),  # a signal with an exit code: no such status
        (1, 1),  # SIGHUP, the lowest
        (0x0100, 0x0100),  # exit 1
        (0xFF00, 0xFF00),  # exit 255, the highest
        (0x10000, None),  # past any exit code
        (0x0101, None),  # an exit code with a signal: no such status
    ],
)
def test_only_a_status_a_process_can_end_with_is_taken(status, taken):
    out = bytearray(report(EMPTY) + STATUS_MARK + b"%08x\n" % status)
    assert split_status(out) == taken
    unmarked = bytearray(b"x" * len(STATUS_MARK) + b"%08x\n" % status)  # (the guest's)
    assert split_status(unmarked) is None


def _collected(script: str, wall_s: float | None = None) -> tuple[bytes, bytes, str | None]:
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err, overrun = collect(
            process, time.perf_counter() + 30, stdout_cap=10_000, stderr_cap=10_000, wall_s=wall_s
        )
    finally:
        process.kill()
        process.wait()
    return bytes(out), bytes(err), overrun


def test_the_ready_mark_is_taken_once_from_the_start_of_stdout():
    """Only the init's first byte on stdout is its ready mark: a guest that writes to
    stderr first (a warning at import) changes nothing, and a result of the guest's that
    begins with the same byte is the guest's (taking it too would restart the clock)."""
    script = (
        "import os, time\nos.write(2, b'a warning')\ntime.sleep(0.3)\n"
        f"os.write(1, {READY_MARK!r})\ntime.sleep(0.3)\nos.write(1, {READY_MARK!r} + b'out')"
    )
    out, err, overrun = _collected(script, wall_s=10)
    assert (out, err, overrun) == (READY_MARK + b"out", b"a warning", None)


def test_a_guest_trickling_bytes_is_read_whole():
    """Hundreds of tiny writes (past the free small reads, each next read is throttled):
    every byte arrives, in order."""
    script = (
        "import os, time\nfor i in range(150):\n    os.write(1, b'%d,' % i)\n    time.sleep(0.002)"
    )
    out, _, overrun = _collected(script)
    assert overrun is None and out == b"".join(b"%d," % i for i in range(150))


def test_the_longest_aspect_is_shown_and_one_past_it_is_not():
    assert GRID.view(200 * 28, 28) is not None  # exactly 200: shown
    assert GRID.view(200 * 28 + 1, 28) is None


def test_output_of_exactly_its_cap_is_no_overrun():
    out, _, overrun = _collected("import os\nos.write(1, b'x' * 10_000)")
    assert overrun is None and len(out) == 10_000  # (the cap _collected sets)
    _, _, over = _collected("import os\nos.write(1, b'x' * 10_001)")
    assert over == "output_limit"
