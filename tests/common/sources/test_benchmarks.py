"""The benchmark readers on small files in the published layouts, and the reference's
scoring rules (including where they and ours disagree)."""

from __future__ import annotations

import base64
import csv
import io
import json
from pathlib import Path

import pytest
from PIL import Image

from common.config import ImageSettings
from common.errors import ImageError
from common.images import content_hash, load_image
from common.protocols.scoring import is_correct, reference_verdict
from common.sources.benchmarks import detect, thyme_jpeg
from common.sources.corpus import read_source
from tests.helpers.benchmarks import write_pope


def image_bytes(colour: tuple[int, int, int], fmt: str = "JPEG") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), colour).save(buffer, format=fmt)
    return buffer.getvalue()


def write_vstar(root: Path) -> None:
    for split, name, options in [
        ("direct_attributes", "sa_1", ["red", "blue", "green", "white"]),
        ("direct_attributes", "sa_2", ["a cup", "a pen"]),
        ("relative_position", "sa_3", ["left", "right"]),
    ]:
        folder = root / split
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.jpg").write_bytes(image_bytes((10, 20, 30)))
        record = {"question": f"Question {name}?", "options": options}
        (folder / f"{name}.json").write_text(json.dumps(record))
    (root / "relative_position" / "sa_4.json").write_text("{not json")


def test_a_vstar_folder_keeps_the_order_its_splits_and_the_first_option_as_answer(tmp_path):
    root = tmp_path / "vstar"
    write_vstar(root)
    assert detect(root) == "vstar" and detect(root / "direct_attributes") == "vstar"
    rows = read_source(root)
    assert [row.item_id for row in rows] == [
        "direct_attributes/sa_1",
        "direct_attributes/sa_2",
        "relative_position/sa_3",
        "relative_position/sa_4",
    ]
    first = rows[0]
    assert first.options == ["red", "blue", "green", "white"] and first.expected == "red"
    assert first.split == "vstar/direct_attributes" and first.question == "Question sa_1?"
    assert rows[2].split == "vstar/relative_position"
    assert rows[3].error is not None and rows[3].error[0] == "invalid_input"  # fails alone


def write_hr(path: Path, images: list[bytes] | None = None) -> list[bytes]:
    images = images or [image_bytes((i * 40, 10, 10)) for i in range(3)]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter="\t")
        writer.writerow(
            [
                "index",
                "image",
                "question",
                "A",
                "B",
                "C",
                "D",
                "answer",
                "category",
                "cycle_category",
            ]
        )
        for i, data in enumerate(images):
            writer.writerow(
                [
                    100 + i,
                    base64.b64encode(data).decode(),
                    f'What is "{i}"?',
                    "red",
                    "blue",
                    "green",
                    "black",
                    "BCD"[i],
                    "single",
                    "x",
                ]
            )
        writer.writerow([103, "%%% not base64", "Q?", "a", "b", "c", "d", "A", "cross", "x"])
    return images


def test_an_hr_tsv_is_streamed_its_images_kept_by_hash(tmp_path):
    path = tmp_path / "hr_bench_4k.tsv"
    images = write_hr(path)
    store = tmp_path / "store"
    rows = read_source(path, image_store=store)
    assert detect(path) == "hr" and len(rows) == 4
    first = rows[0]
    assert (first.item_id, first.split, first.category) == (
        "hr_bench_4k/100",
        "hr/hr_bench_4k",
        "single",
    )
    assert first.options == ["red", "blue", "green", "black"] and first.expected == "B"
    assert first.question == 'What is "0"?'
    kept = Path(first.image_path or "")
    assert kept.is_relative_to(store) and kept.read_bytes() == images[0]
    assert kept.name.startswith(content_hash(images[0])) and kept.suffix == ".jpeg"
    assert rows[3].error is not None and "base64" in rows[3].error[1]


def test_pope_parquet_files_and_folders(tmp_path):
    root = tmp_path / "POPE"
    write_pope(root / "Full" / "random-00000-of-00001.parquet")
    write_pope(root / "Full" / "adversarial-00000-of-00001.parquet")
    assert detect(root) == "pope"
    rows = read_source(root, image_store=tmp_path / "store")
    assert [row.position for row in rows] == list(range(10))
    assert {row.split for row in rows} == {"pope/adversarial", "pope/random"}
    first = rows[0]
    assert (first.item_id, first.expected, first.options, first.category) == (
        "adversarial/q0",
        "no",
        None,
        "coco",
    )
    assert Path(first.image_path or "").suffix == ".png"


def _saved_as_thyme_does(data: bytes) -> bytes:
    """eval_code_thyme/SpecEyes.py decode_base64_to_temp_image (and its POPE loader):
    RGBA / P to RGB, then JPEG at quality 95."""
    image = Image.open(io.BytesIO(data))
    if image.mode in ("RGBA", "P"):
        image = image.convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


def test_for_thyme_hr_and_pope_images_are_kept_as_its_evaluation_writes_them(tmp_path):
    """Every Thyme phase sees HR-Bench's and POPE's images as the quality-95 JPEG the
    evaluation writes for the code; a DeepEyes run keeps the file's own bytes."""
    path = tmp_path / "hr_bench_4k.tsv"
    images = write_hr(path)
    rows = read_source(path, image_store=tmp_path / "store", for_thyme=True)
    kept = Path(rows[0].image_path or "")
    assert kept.read_bytes() == _saved_as_thyme_does(images[0]) != images[0]
    assert rows[0].image_hash == content_hash(kept.read_bytes())
    pope = tmp_path / "POPE" / "Full" / "random-00000-of-00001.parquet"
    write_pope(pope)
    first = read_source(pope, image_store=tmp_path / "store", for_thyme=True)[0]
    assert Path(first.image_path or "").suffix == ".jpeg"  # (the file holds a PNG)


@pytest.mark.parametrize("mode", ["RGBA", "P", "L"])
def test_thyme_jpeg_converts_what_the_evaluation_converts(mode: str):
    buffer = io.BytesIO()
    Image.new(mode, (20, 10)).save(buffer, format="PNG")
    saved = thyme_jpeg(buffer.getvalue())
    assert saved == _saved_as_thyme_does(buffer.getvalue())
    assert Image.open(io.BytesIO(saved)).mode == ("L" if mode == "L" else "RGB")


def test_thyme_jpeg_refuses_what_it_cannot_save():
    with pytest.raises(ImageError):
        thyme_jpeg(b"not an image")


@pytest.mark.parametrize(
    ("benchmark", "answer", "expected", "options", "reference", "ours"),
    [
        ("vstar", "A", "red", ["red", "blue"], True, True),
        ("vstar", "A.", "red", ["red", "blue"], True, True),
        ("vstar", "A. red", "red", ["red", "blue"], True, True),
        ("vstar", "red", "red", ["red", "blue"], None, True),  # the reference asks its judge
        ("vstar", "B", "red", ["red", "blue"], False, False),
        ("hr", "B", "B", ["red", "blue", "c", "d"], True, True),
        ("hr", "Blue", "B", ["red", "green", "c", "d"], True, False),  # contains the letter
        ("hr", "green", "B", ["red", "blue", "green", "d"], None, False),
        ("pope", "yes", "yes", None, True, True),
        ("pope", "Yes", "yes", None, False, True),  # same length, case counts
        ("pope", "Yes, there is.", "yes", None, None, True),
        ("pope", "\\boxed{no}", "no", None, True, False),
    ],
)
def test_reference_rules_and_ours(benchmark, answer, expected, options, reference, ours):
    assert reference_verdict(benchmark, answer, expected, options) is reference
    assert is_correct(answer, expected, options) is ours


@pytest.mark.parametrize("expected", ["Z", "1", "purple", "e"])
def test_an_expected_answer_that_is_no_option_is_compared_as_text(expected: str) -> None:
    """A labelled row whose answer names no option (a letter past the last, a digit, a
    text not among them) scores as text, never as an error that stops a batch's pages."""
    options = ["cat", "dog", "cow", "hen"]
    assert is_correct("dog", expected, options) is False
    assert is_correct(expected, expected, options) is True


def test_annotate_scores_each_split_both_ways(tmp_path, capsys, monkeypatch):
    from cli.main import main

    monkeypatch.setenv("SPECEYES_UPLOAD_DIR", str(tmp_path / "uploads"))
    path = tmp_path / "POPE" / "Full" / "random-00000-of-00001.parquet"
    write_pope(path)
    db = f"sqlite:///{tmp_path / 's.db'}"
    out = tmp_path / "out.jsonl"
    code = main(
        [
            "annotate",
            str(path),
            "--backend",
            "scripted",
            "--db",
            db,
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "pope/random" in printed and "reference" in printed
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {row["split"] for row in rows} == {"pope/random"} and len(rows) == 5


def _turned_jpeg() -> bytes:
    """A 40x30 JPEG, left half red, whose EXIF says "turn me a quarter" (orientation 6)."""
    image = Image.new("RGB", (40, 30), (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, 20, 30))
    exif = Image.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=95, exif=exif)
    return buffer.getvalue()


def _qwen_to_rgb(image: Image.Image) -> Image.Image:
    """qwen_vl_utils' to_rgb, which the evaluation's models' images pass through: RGBA
    composed on white, anything else converted."""
    if image.mode == "RGBA":
        canvas = Image.new("RGB", image.size, (255, 255, 255))
        canvas.paste(image, mask=image.split()[3])
        return canvas
    return image.convert("RGB")


def _pixels(path: str | None) -> bytes:
    return load_image(path or "")[0].tobytes()


def test_a_benchmark_image_is_never_turned_by_its_exif_as_the_reference_never_does(tmp_path):
    """V* (its own file) and POPE: the reference opens the file and never applies EXIF;
    our loader turns photographs, so the readers keep those images unturned."""
    turned = _turned_jpeg()
    root = tmp_path / "vstar" / "direct_attributes"
    root.mkdir(parents=True)
    (root / "sa_1.jpg").write_bytes(turned)
    (root / "sa_1.json").write_text(json.dumps({"question": "Q?", "options": ["a", "b"]}))
    (root / "sa_2.jpg").write_bytes(image_bytes((10, 20, 30)))
    (root / "sa_2.json").write_text(json.dumps({"question": "Q?", "options": ["a", "b"]}))
    seen, plain = read_source(tmp_path / "vstar", image_store=tmp_path / "store")
    reference = _qwen_to_rgb(Image.open(io.BytesIO(turned)))  # 40x30, unturned
    assert _pixels(seen.image_path) == reference.tobytes()
    assert load_image(seen.image_path or "")[0].size == (40, 30)
    assert seen.image_hash == content_hash(Path(seen.image_path or "").read_bytes())
    assert plain.image_path == str((root / "sa_2.jpg").resolve())  # nothing to change
    # a user's photograph is still turned (images.exif_rotate), or not when asked
    assert load_image(root / "sa_1.jpg")[0].size == (30, 40)
    assert load_image(root / "sa_1.jpg", ImageSettings(exif_rotate=False))[0].size == (40, 30)


@pytest.mark.parametrize("mode", ["RGBA", "P"])
def test_transparency_is_converted_as_each_benchmark_s_loader_converts_it(tmp_path, mode):
    """HR-Bench: RGBA and P converted to RGB on decoding (decode_base64_to_image, no white);
    POPE: opened as it is, then qwen_vl_utils' to_rgb (RGBA on white, P converted)."""
    image = Image.new("RGBA", (40, 30), (200, 10, 10, 0))  # transparent red
    image.paste((10, 200, 10, 255), (0, 0, 20, 30))
    if mode == "P":
        image = image.convert("P")
        image.info["transparency"] = image.getpixel((30, 10))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    data = buffer.getvalue()
    opened = Image.open(io.BytesIO(data))

    hr = tmp_path / "hr_bench_4k.tsv"
    write_hr(hr, images=[data])
    (row, *_) = read_source(hr, image_store=tmp_path / "store")
    assert _pixels(row.image_path) == _qwen_to_rgb(opened.convert("RGB")).tobytes()

    pope = tmp_path / "POPE" / "Full" / "random-00000-of-00001.parquet"
    write_pope(pope, image=data)
    (row, *_) = read_source(pope, image_store=tmp_path / "store")
    assert _pixels(row.image_path) == _qwen_to_rgb(opened).tobytes()


def test_for_thyme_each_image_is_named_by_the_evaluation_s_path(tmp_path):
    """eval_code_thyme/SpecEyes.py: V* files under --vstar_path's default, HR-Bench's and
    POPE's re-saved as {row:08d}.jpg in its temporary folders; a DeepEyes run names none
    (nothing shows a path)."""
    root = tmp_path / "vstar"
    write_vstar(root)
    vstar = read_source(root, image_store=tmp_path / "store", for_thyme=True)
    assert vstar[0].shown_path == "data/vstar/direct_attributes/sa_1.jpg"
    assert vstar[2].shown_path == "data/vstar/relative_position/sa_3.jpg"
    hr = tmp_path / "hr_bench_8k.tsv"
    write_hr(hr)
    rows = read_source(hr, image_store=tmp_path / "store", for_thyme=True)
    assert [row.shown_path for row in rows[:2]] == [
        "./eval_code_thyme/_tmp_hr_images/hr_bench_8k/00000000.jpg",
        "./eval_code_thyme/_tmp_hr_images/hr_bench_8k/00000001.jpg",
    ]
    pope = tmp_path / "POPE" / "Full" / "popular-00000-of-00001.parquet"
    write_pope(pope)
    rows = read_source(pope, image_store=tmp_path / "store", for_thyme=True)
    assert rows[4].shown_path == "./eval_code_thyme/_tmp_pope_images/popular/00000004.jpg"
    assert all(row.shown_path is None for row in read_source(root, image_store=tmp_path / "s"))


def test_a_linked_vstar_file_is_named_by_its_own_name(tmp_path):
    """A Hugging Face snapshot links NAME.jpg to blobs/<sha256>: the evaluation lists the
    folder and names NAME.jpg, never the blob."""
    root = tmp_path / "vstar" / "direct_attributes"
    root.mkdir(parents=True)
    blob = tmp_path / "blobs" / "3f2a9c"
    blob.parent.mkdir()
    blob.write_bytes(image_bytes((10, 20, 30)))
    (root / "sa_7.jpg").symlink_to(blob)
    (root / "sa_7.json").write_text(json.dumps({"question": "Q?", "options": ["a", "b"]}))
    (row,) = read_source(tmp_path / "vstar", image_store=tmp_path / "store", for_thyme=True)
    assert row.shown_path == "data/vstar/direct_attributes/sa_7.jpg"


def _noise(mode: str) -> bytes:
    """A 300 x 200 textured image in ``mode``, as PNG bytes; with alpha (RGBA, LA), its
    alpha random a pixel and a transparent band."""
    import numpy

    pixels = numpy.random.default_rng(2).integers(0, 256, (200, 300, 4), dtype=numpy.uint8)
    pixels[60:90, :, 3] = 0
    image = Image.fromarray(pixels, "RGBA")
    if mode not in ("RGBA", "LA"):
        image = image.convert("RGB")
    buffer = io.BytesIO()
    image.convert(mode).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("benchmark", "mode"),
    [("vstar", "P"), ("vstar", "1"), ("pope", "P"), ("vstar", "RGBA"), ("pope", "LA")],
)
def test_an_image_is_resized_in_its_own_mode_before_it_is_made_rgb(tmp_path, benchmark, mode):
    """eval_code_deepeyes/SpecEyes.py: pil_img.resize((w, h), resample=Image.BICUBIC) on
    the image as it was opened, which Pillow does by nearest neighbour for "P" and "1"
    and premultiplied for RGBA and LA; then qwen_vl_utils' to_rgb. Converting first and
    resizing after was 26 ("P") and 55 ("1") grey levels apart on average, and 0.7 (19
    at most) for RGBA. The same for a zoom's crop."""
    from common.protocols import REFERENCE

    data = _noise(mode)
    if benchmark == "vstar":
        root = tmp_path / "vstar" / "direct_attributes"
        root.mkdir(parents=True)
        (root / "sa_1.jpg").write_bytes(data)  # (a PNG under V*'s name: opened by content)
        (root / "sa_1.json").write_text(json.dumps({"question": "Q?", "options": ["a", "b"]}))
        (row,) = read_source(tmp_path / "vstar", image_store=tmp_path / "store")
    else:
        write_pope(tmp_path / "POPE" / "Full" / "random-00000-of-00001.parquet", image=data)
        (row, *_) = read_source(tmp_path / "POPE", image_store=tmp_path / "store")
    ours = load_image(row.image_path or "")[0]
    grid = REFERENCE.image_grid
    assert grid is not None

    opened = Image.open(io.BytesIO(data))  # the reference's pil_img
    size = grid.size_for(*opened.size)
    reference = _qwen_to_rgb(opened.resize(size, resample=Image.BICUBIC))
    assert REFERENCE.view(ours).tobytes() == reference.tobytes()

    box = (17, 9, 140, 101)  # a zoom's crop, resized as the evaluation resizes it
    crop_size = grid.size_for(box[2] - box[0], box[3] - box[1])
    cropped = _qwen_to_rgb(opened.crop(box).resize(crop_size, resample=Image.BICUBIC))
    assert grid.apply(ours, box).tobytes() == cropped.tobytes()


def test_an_rgb_image_and_hr_benchs_palette_are_resized_bicubic():
    """HR-Bench converts a palette image to RGB before anything (decode_base64_to_image):
    bicubic, as every RGB image."""
    from common.images import RESAMPLE_MARK
    from common.sources.benchmarks import reference_view

    hr = Image.open(io.BytesIO(reference_view(_noise("P"), "hr")))
    assert RESAMPLE_MARK not in hr.info
    vstar = Image.open(io.BytesIO(reference_view(_noise("P"), "vstar")))
    assert vstar.info[RESAMPLE_MARK] == "nearest"


class _Folder:
    """What ``place_image`` needs of a sandbox session: its folder, and a path inside."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def inside(self, relative: str) -> str:
        return f"/mnt/data/{relative}"


@pytest.mark.parametrize("mode", ["exif", "P", "RGBA", "L", "1"])
def test_thyme_hands_a_vstar_file_to_its_code_as_it_is(tmp_path, mode):
    """eval_code_thyme: the code is handed the V* file's own path, so its own bytes,
    whatever they hold (an EXIF orientation, a palette, a PNG of any mode); the models
    see its pixels as the reference does. A quality-95 re-save of the kept PNG was 5.9
    grey levels off; of a grey PNG that needs no keeping, 1.5 (0.7 for a bilevel one).
    The agent's first turn names the file (utils.py run_evaluation), which qwen_vl_utils'
    fetch_image makes RGB, then resizes: not in its own mode, as phases I and II are."""
    from common.agents.thyme import place_image, start
    from common.contracts import Query
    from common.protocols import THYME

    data = _turned_jpeg() if mode == "exif" else _noise(mode)
    root = tmp_path / "vstar" / "direct_attributes"
    root.mkdir(parents=True)
    (root / "sa_1.jpg").write_bytes(data)
    (root / "sa_1.json").write_text(json.dumps({"question": "Q?", "options": ["a", "b"]}))
    (row,) = read_source(tmp_path / "vstar", image_store=tmp_path / "store", for_thyme=True)
    kept = row.image_path != str((root / "sa_1.jpg").resolve())  # (the models' PNG)
    assert kept == (mode in ("exif", "P", "RGBA"))
    image = load_image(row.image_path or "")[0]
    query = Query("q", image, "Q?", ("a", "b"), row.image_path, row.shown_path)

    shown = place_image(query, _Folder(tmp_path / "sandbox"))  # type: ignore[arg-type]

    placed = tmp_path / "sandbox" / "data" / "vstar" / "direct_attributes" / "sa_1.jpg"
    assert placed.read_bytes() == data
    opened = Image.open(io.BytesIO(data))  # (the reference never turns it)
    assert shown.tobytes() == _qwen_to_rgb(opened).tobytes()

    grid = THYME.image_grid
    assert grid is not None
    first_view = start(query, THYME, _Folder(tmp_path / "again"))[1].images[0]  # type: ignore[arg-type]
    fetched = _qwen_to_rgb(opened).resize(grid.size_for(*opened.size), Image.BICUBIC)
    assert first_view.tobytes() == fetched.tobytes()


def test_a_file_beside_a_jobs_image_that_is_no_image_never_reaches_the_sandbox(tmp_path):
    """``.original`` is the name the V* reader keeps a file under for Thyme; a job may
    name an image beside which a file of that name lies that is no image (a secret, a
    script): it is not handed to the code, the image is (re-saved as a JPEG)."""
    from common.agents.thyme import place_image
    from common.contracts import Query

    image = tmp_path / "photo.png"
    image.write_bytes(_noise("RGB"))
    (tmp_path / "photo.original").write_text("TOKEN=secret\n")
    query = Query("q", load_image(image)[0], "Q?", None, str(image))

    place_image(query, _Folder(tmp_path / "sandbox"))  # type: ignore[arg-type]

    (placed,) = (tmp_path / "sandbox").iterdir()
    assert placed.read_bytes()[:3] == b"\xff\xd8\xff"  # a JPEG of the image, no secret
