"""Image loading: every kind of bad input is an ImageError with a reason."""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest
from PIL import Image

from common.config import ImageSettings
from common.errors import ImageError
from common.images import (
    PixelBudget,
    ResizeRule,
    check_image,
    content_hash,
    decode_image,
    load_image,
    smart_resize,
)


def encode(image: Image.Image, fmt: str = "PNG", **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def test_a_good_image_loads_as_rgb_with_its_hash(tmp_path: Path):
    data = encode(Image.new("RGB", (40, 30), (1, 2, 3)))
    path = tmp_path / "ok.png"
    path.write_bytes(data)
    image, digest = load_image(path)
    assert image.mode == "RGB" and image.size == (40, 30)
    assert digest == content_hash(data) and len(digest) == 64


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b"this is not an image at all", "not an image"),
        (encode(Image.new("RGB", (64, 64), (9, 9, 9)), "JPEG")[:200], "corrupt or truncated"),
        (encode(Image.new("RGB", (64, 64)), "PNG")[:60], "corrupt or truncated"),
    ],
    ids=["zero-byte", "not-an-image", "truncated-jpeg", "truncated-png"],
)
def test_bad_bytes_fail_with_a_reason(data: bytes, reason: str):
    with pytest.raises(ImageError, match=reason):
        decode_image(data, ImageSettings())
    with pytest.raises(ImageError, match=reason):  # the API's lighter check finds it too
        check_image(data, ImageSettings())


def test_too_many_bytes_is_refused_before_decoding():
    data = encode(Image.new("RGB", (64, 64)))
    with pytest.raises(ImageError, match="above the limit") as error:
        decode_image(data, ImageSettings(max_bytes=len(data) - 1))
    assert error.value.code == "image_too_large"


def test_too_many_pixels_is_refused_before_decoding():
    # A tiny file that declares a large canvas: refused from its header alone.
    data = encode(Image.new("1", (5000, 5000)))
    assert len(data) < 10_000
    with pytest.raises(ImageError, match="pixels, above the limit") as error:
        decode_image(data, ImageSettings(max_pixels=1_000_000))
    assert error.value.code == "image_too_many_pixels"


def test_an_image_longer_than_the_models_take_is_refused_with_its_shape():
    """max_image_aspect: a 3000x10 strip fails as an image, in one line, not later as a
    model's traceback (Qwen's processor refuses an aspect ratio over 200)."""
    data = encode(Image.new("RGB", (3000, 10)))
    with pytest.raises(ImageError) as error:
        check_image(data, ImageSettings())
    assert error.value.code == "image_aspect_ratio"
    assert str(error.value).startswith("image is 3000x10: its aspect ratio 300:1 is above")
    decode_image(encode(Image.new("RGB", (2000, 10))), ImageSettings())  # 200:1 is fine


def test_the_pixel_limit_is_ours_not_pillows():
    # 95 M pixels: Pillow alone refuses anything over 89,478,485 (its bomb warning)
    data = encode(Image.new("1", (10_000, 9_500)))
    image = decode_image(data, ImageSettings(max_pixels=100_000_000))
    assert image.size == (10_000, 9_500)
    del image
    with pytest.raises(ImageError, match="above the limit of 90000000"):
        decode_image(data, ImageSettings(max_pixels=90_000_000))


def test_a_pixel_budget_bounds_what_is_decoded_at_once():
    from concurrent.futures import ThreadPoolExecutor

    data = encode(Image.new("RGB", (1000, 1000), (5, 6, 7)))  # 1 M pixels each
    budget = PixelBudget(2_500_000)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: check_image(data, ImageSettings(), budget), range(16)))
    assert 1_000_000 <= budget.peak <= 2_000_000 and budget.held == 0
    alone = PixelBudget(10)  # an image larger than the whole budget still goes, alone
    check_image(data, ImageSettings(), alone)
    assert alone.peak == 1_000_000


def test_a_jpeg_is_checked_at_an_eighth_of_its_size():
    data = encode(Image.new("RGB", (800, 640), (200, 10, 10)), "JPEG")
    budget = PixelBudget(10**9)
    check_image(data, ImageSettings(), budget)
    assert budget.peak == 100 * 80
    assert decode_image(data, ImageSettings()).size == (800, 640)  # a job's decode is whole


def test_missing_file_and_folder(tmp_path: Path):
    with pytest.raises(ImageError, match="not found") as error:
        load_image(tmp_path / "nope.png")
    assert error.value.code == "image_missing"
    with pytest.raises(ImageError, match="not a file"):
        load_image(tmp_path)


def test_exif_orientation_is_applied():
    image = Image.new("RGB", (60, 20), (0, 0, 255))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise on display
    rotated = decode_image(encode(image, "JPEG", exif=exif), ImageSettings())
    assert rotated.size == (20, 60)


def test_transparency_becomes_white():
    image = Image.new("RGBA", (10, 10), (255, 0, 0, 0))
    image.putpixel((0, 0), (255, 0, 0, 255))
    rgb = decode_image(encode(image), ImageSettings())
    assert rgb.mode == "RGB"
    assert rgb.getpixel((5, 5)) == (255, 255, 255)
    assert rgb.getpixel((0, 0)) == (255, 0, 0)


def test_an_alpha_first_image_is_resized_from_its_alpha_image_and_nothing_else_is():
    """An ``alpha-first`` mark (``reference_view``) keeps the alpha image beside the RGB
    one, for a rule ``in_own_mode`` (a processor's rule ignores it). Pillow copies
    ``info`` into every image made from the RGB one: an edit of the same size is resized
    as what it is, not as the alpha image; a pickled copy drops it. A file's own text
    chunk of the source's name is text; the alpha image held counts in its pixels."""
    import pickle

    from PIL import PngImagePlugin

    from common.images import ALPHA_FIRST, ALPHA_SOURCE, RESAMPLE_MARK, image_pixels

    def marked(image: Image.Image, **chunks: str) -> bytes:
        info = PngImagePlugin.PngInfo()
        for key, value in {RESAMPLE_MARK: ALPHA_FIRST, **chunks}.items():
            info.add_text(key, value)
        return encode(image, pnginfo=info)

    rgba = Image.new("RGBA", (60, 40), (200, 10, 10, 0))
    rgba.paste((10, 200, 10, 255), (0, 0, 30, 40))
    decoded = decode_image(marked(rgba), ImageSettings())
    assert decoded.mode == "RGB"
    own = ResizeRule(28, 56 * 56, 56 * 56 * 4, in_own_mode=True)
    premultiplied = rgba.resize(own.size_for(60, 40), Image.Resampling.BICUBIC)
    expected = Image.new("RGB", premultiplied.size, (255, 255, 255))  # qwen_vl_utils' to_rgb
    expected.paste(premultiplied, mask=premultiplied.getchannel("A"))
    assert own.apply(decoded).tobytes() == expected.tobytes()
    assert own.apply(decoded, (0, 0, 30, 20)).mode == "RGB"

    turned = decoded.transpose(Image.Transpose.ROTATE_180)  # same size, info copied
    assert (
        own.apply(turned).tobytes() == ResizeRule(28, 56 * 56, 56 * 56 * 4).apply(turned).tobytes()
    )
    copied = pickle.loads(pickle.dumps(decoded))
    assert copied.info[ALPHA_SOURCE] is None
    assert (
        own.apply(copied).tobytes() == ResizeRule(28, 56 * 56, 56 * 56 * 4).apply(copied).tobytes()
    )
    assert image_pixels(io.BytesIO(marked(rgba))) == 60 * 40 * 7 // 3
    assert image_pixels(io.BytesIO(encode(rgba))) == 60 * 40

    rgb = Image.new("RGB", (60, 40), (1, 2, 3))
    hostile = decode_image(marked(rgb, **{ALPHA_SOURCE: "x"}), ImageSettings())
    assert own.apply(hostile).tobytes() == own.apply(rgb).tobytes()


@pytest.mark.parametrize("mode", ["L", "P", "CMYK", "I;16", "1", "LA"])
def test_every_mode_becomes_rgb(mode: str):
    fmt = "JPEG" if mode == "CMYK" else "PNG"
    image = Image.new(mode, (8, 8))
    assert decode_image(encode(image, fmt), ImageSettings()).mode == "RGB"


def test_an_animation_gives_its_first_frame():
    frames = [Image.new("RGB", (16, 16), colour) for colour in [(255, 0, 0), (0, 255, 0)]]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    first = decode_image(data, ImageSettings())
    red, green, _ = first.getpixel((8, 8))
    assert red > 200 and green < 50


# (height, width) -> what eval_code_deepeyes/utils.py smart_resize returns (run on the
# reference's own function; the same in eval_code_thyme/utils.py)
REFERENCE_RESIZES = {
    (10, 500): (28, 504),  # transformers' rule: (28, 420)
    (500, 10): (504, 28),
    (3, 2000): (28, 1988),  # transformers' refuses the aspect ratio (over 200)
    (2000, 3): (1988, 28),
    (0, 500): (28, 504),  # an empty crop: factor wide
    (7, 29): (28, 140),
    (13, 15): (56, 84),
    (14, 14): (56, 56),
    (1, 1): (56, 56),
    (1200, 1600): (1204, 1596),
    (4320, 7680): (2688, 4760),
}


@pytest.mark.parametrize(("size", "expected"), REFERENCE_RESIZES.items())
def test_smart_resize_is_the_references(size, expected):
    assert smart_resize(*size, 28, 4 * 784, 16384 * 784) == expected


def test_an_empty_image_too_small_to_enlarge_is_an_image_error():
    with pytest.raises(ImageError, match="no pixels to enlarge"):
        smart_resize(0, 40, 28, 4 * 784, 16384 * 784)  # the evaluation divides by zero


def test_smart_resize_agrees_with_transformers_where_the_rules_meet():
    """Sides over half the factor (15 px at 28, 17 at 32: a side of 14 rounds to 0,
    which only the reference lifts to 28) and aspect ratios up to 200: one rule."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        smart_resize as transformers_rule,
    )

    rng = random.Random(7)
    sizes = [(1200, 1600), (28, 28), (17, 1000), (4000, 3000), (300, 200)]
    sizes += [(rng.randint(17, 5000), rng.randint(17, 5000)) for _ in range(200)]
    for height, width in sizes:
        if max(height, width) / min(height, width) > 200:
            continue
        for factor, low, high in [(28, 4 * 784, 16384 * 784), (32, 4096, 65536)]:
            assert smart_resize(height, width, factor, low, high) == transformers_rule(
                height, width, factor, low, high
            )


def test_resize_rule_gives_multiples_of_the_factor():
    rule = ResizeRule(factor=28, min_pixels=3136, max_pixels=50176)
    resized = rule.apply(Image.new("RGB", (448, 336)))
    assert resized.size == (252, 168)
    assert resized.width % 28 == 0 and resized.height % 28 == 0
