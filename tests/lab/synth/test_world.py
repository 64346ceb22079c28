"""The synth world: deterministic, well-formed, readable by every loader."""

from __future__ import annotations

import json
from pathlib import Path

from common.sources.corpus import read_source
from lab.synth.world import (
    CELL,
    COLOURS,
    EASY_SIZES,
    HARD_SIZES,
    JITTER,
    QUARTERS,
    SIZE,
    items,
    make_item,
    write_hr,
    write_manifest,
    write_pope,
    write_vstar,
)


def test_the_same_seed_gives_the_same_items_pixel_for_pixel():
    first, second = list(items(6, seed=3)), list(items(6, seed=3))
    assert first == second
    assert [i.render().tobytes() for i in first] == [i.render().tobytes() for i in second]
    assert list(items(6, seed=4)) != first


def test_targets_sit_inside_their_cell_at_their_difficultys_size():
    for item in items(300, seed=1):
        left, top, right, bottom = item.box
        low, high = EASY_SIZES if item.difficulty == "easy" else HARD_SIZES
        assert low <= right - left <= high and right - left == bottom - top
        c_left, c_top, c_right, c_bottom = item.cell
        assert c_right - c_left == CELL and c_left <= left and right <= c_right
        assert c_top <= top and bottom <= c_bottom and c_right <= SIZE
        assert item.view_box() == [v // 4 for v in item.cell]  # 896 px shown at 224


def test_each_image_holds_two_or_three_shapes_one_of_each_kind_and_colour():
    generated = list(items(300, seed=6))
    for item in generated:
        things = item.things
        assert 2 <= len(things) <= 3 and things[0].box == item.box
        assert len({t.shape for t in things}) == len({t.colour for t in things}) == len(things)
        cells = {(t.box[0] // CELL, t.box[1] // CELL) for t in things}
        assert len(cells) == len(things)  # one to a cell: a zoom shows the target alone
        for other in item.others:  # the clutter is large: the one small shape is the target
            left, top, right, bottom = other.box
            assert EASY_SIZES[0] <= right - left <= EASY_SIZES[1]
            assert (right - 1) // CELL == left // CELL and (bottom - 1) // CELL == top // CELL
    assert {len(item.things) for item in generated} == {2, 3}
    negatives = [item for item in generated if item.answer == "no"]
    in_image = sum(item.asked in {t.colour for t in item.others} for item in negatives)
    assert in_image > len(negatives) / 3  # "no" often names a colour that is in the image


def test_a_small_target_lies_inside_one_patch_of_either_models_view():
    agent_patch, small_patch = 14 * SIZE // 224, 16 * SIZE // 128  # in original pixels
    for item in items(300, seed=8):
        if item.difficulty == "hard":
            for patch in (agent_patch, small_patch):
                assert item.box[0] // patch == (item.box[2] - 1) // patch
                assert item.box[1] // patch == (item.box[3] - 1) // patch
            for low, high in ((item.box[0], item.box[2]), (item.box[1], item.box[3])):
                offset = (low + high) / 2 - low // CELL * CELL  # around a quarter's middle
                assert min(abs(offset - middle) for middle in QUARTERS) <= JITTER + 1


def test_questions_and_answers_agree():
    generated = list(items(400, seed=2))
    for item in generated:
        if item.kind == "choice":
            assert sorted(item.options or []) == ["blue", "green", "red", "yellow"]
            assert item.answer == item.colour and item.shape in item.question
        else:
            asked = item.question.split()[3]
            assert item.answer == ("yes" if asked == item.colour else "no")
    yes = sum(i.answer == "yes" for i in generated if i.kind == "yesno")
    hard = sum(i.difficulty == "hard" for i in generated)
    assert 0.35 < yes / sum(i.kind == "yesno" for i in generated) < 0.65
    assert 0.4 < hard / len(generated) < 0.6


def test_every_shape_is_drawn_where_its_box_says_in_its_colour():
    item = make_item(11, difficulty="hard")
    image = item.render()
    for thing in item.things:
        left, top, right, bottom = thing.box
        centre = image.getpixel(((left + right) // 2, (top + bottom) // 2 + 2))
        assert centre == COLOURS[thing.colour]
    assert image.size == (SIZE, SIZE)


def test_the_writers_produce_the_benchmark_formats(tmp_path: Path):
    import pyarrow.parquet as pq

    generated = list(items(12, seed=5))
    manifest = write_manifest(generated, tmp_path / "corpus")
    rows = read_source(manifest)
    assert [row.item_id for row in rows] == [item.id for item in generated]
    assert all(row.error is None and row.expected for row in rows)
    write_vstar(generated, tmp_path / "vstar")
    choices = [item for item in generated if item.kind == "choice"]
    for item in choices:
        record = json.loads(
            (tmp_path / "vstar" / "direct_attributes" / f"{item.id}.json").read_text()
        )
        assert record["options"][0] == item.answer  # V*: the correct option comes first
        assert (tmp_path / "vstar" / "direct_attributes" / f"{item.id}.jpg").is_file()
    write_pope(generated, tmp_path / "pope.parquet")
    table = pq.read_table(tmp_path / "pope.parquet")
    assert {"id", "question_id", "question", "answer", "image_source", "category", "image"} <= set(
        table.column_names
    )
    assert table.num_rows == len(generated) - len(choices)
    assert set(table.column("answer").to_pylist()) <= {"yes", "no"}
    assert table.column("image").to_pylist()[0]["bytes"][:4] == b"\x89PNG"


def test_the_synth_benchmark_files_read_back_through_the_benchmark_readers(tmp_path: Path):
    generated = list(items(12, seed=5))
    choices = {item.id: item for item in generated if item.kind == "choice"}
    write_vstar(generated, tmp_path / "vstar")
    write_hr(generated, tmp_path / "hr_bench_synth.tsv")
    write_pope(generated, tmp_path / "POPE" / "Full" / "random-00000-of-00001.parquet")
    store = tmp_path / "store"
    vstar = read_source(tmp_path / "vstar")
    assert {row.item_id.split("/")[1] for row in vstar} == set(choices)
    assert all(row.expected == choices[row.item_id.split("/")[1]].answer for row in vstar)
    hr = read_source(tmp_path / "hr_bench_synth.tsv", image_store=store)
    assert [row.expected for row in hr] == [item.answer_letter for item in choices.values()]
    assert all(row.error is None and Path(row.image_path or "").is_file() for row in hr)
    pope = read_source(tmp_path / "POPE", image_store=store)
    assert len(pope) == len(generated) - len(choices)
    assert {row.split for row in pope} == {"pope/random"}


def test_a_split_can_need_tools_more_or_less_often_than_the_world():
    """--hard-share: the same seeded stream, its first hard and easy items in proportion
    (the world's own draw, about half, when not given)."""
    heavy = list(items(20, seed=5, hard_share=0.8))
    assert [item.difficulty for item in heavy].count("hard") == 16
    world = [item.id for item in items(60, seed=5)]
    assert all(item.id in world for item in heavy)  # (a subset of the same stream)
    assert [item.difficulty for item in items(10, seed=5, hard_share=0.0)] == ["easy"] * 10
    assert [item.id for item in items(12, seed=5)] == world[:12]
    split = list(items(10, seed=5, hard_share=0.8, kind="yesno"))  # (a POPE-like split)
    assert {item.kind for item in split} == {"yesno"} and len(split) == 10
    assert [item.difficulty for item in split].count("hard") == 8
