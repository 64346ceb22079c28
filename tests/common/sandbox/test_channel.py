"""The host's reading of a guest's report, and the guest's reading of its own printed
paths: every malformed report is one ``BadReport``, every text comes out clean, and the
linear path scan finds exactly what the evaluation's regex finds."""

from __future__ import annotations

import json
import random
import re
import unicodedata

import pytest

from common.sandbox.channel import BadReport, ReportLimits, clean_text, decode_text, parse
from common.sandbox.guest.outputs import printed_paths

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
        (b"x" * 5000 + b"\n", "no report line within 4096"),
        (b"[" * 2000 + b"]" * 2000 + b"\n", "not valid JSON (RecursionError)"),
        (b"\xff\xfe\n", "not valid JSON"),
        (report([1, 2]), "not a JSON object"),
        (report({**EMPTY, "images": [{"width": 1, "height": 1}] * 3}), "at most 2"),
        (report({**EMPTY, "images": {"width": 1}}), "at most 2"),
        (report({**EMPTY, "images": [{"width": True, "height": 1}]}, b"xxx"), "positive"),
        (report({**EMPTY, "images": [{"width": 0, "height": 5}]}), "positive"),
        (report({**EMPTY, "images": [[1, 1]]}), "positive"),
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
