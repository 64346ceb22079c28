"""Training mechanics on the tiny random checkpoints (seconds, not a real training)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from common.backends.transformers_backend import load_processor
from common.images import ResizeRule
from lab.synth.train import (
    Batcher,
    agent_examples,
    answer_text,
    build_pool,
    copy_checkpoint,
    curriculum_items,
    make_views,
    rule_of,
    set_view,
    small_example,
    small_examples,
    target_loss,
    train,
)
from lab.synth.world import make_item

SMALL_RULE, AGENT_RULE = ResizeRule(32, 4096, 65536), ResizeRule(28, 3136, 50176)


def test_the_targets_are_exactly_the_last_assistant_turn(tiny_paths):
    batcher = Batcher(load_processor(str(tiny_paths["large"])))
    pool = build_pool(4, 1, SMALL_RULE, AGENT_RULE)
    examples = [
        example for item, views in pool for example in agent_examples(item, views, AGENT_RULE)
    ]
    batch = batcher(examples)
    decode = batcher.processor.tokenizer.decode
    for row, example in enumerate(examples):
        wanted = "".join(str(part) for part in example.messages[-1].content) + "<|im_end|>"
        assert decode(batch.targets[batch.positions[0] == row]) == wanted
    assert batch.unsure == []


def test_an_unsure_answer_teaches_an_even_share_of_the_possible_answers(tiny_paths):
    batcher = Batcher(load_processor(str(tiny_paths["small"])))
    encode = batcher.processor.tokenizer.encode
    item = make_item(7, difficulty="hard", kind="choice")
    views = make_views(item, SMALL_RULE, AGENT_RULE)
    sure, unsure = small_example(item, views.small), small_example(item, views.small, unsure=True)
    batch = batcher([sure, unsure])
    (index, ids), *others = batch.unsure
    assert others == [] and batch.positions[0][index] == 1  # the unsure example's ...
    assert index == 0 or batch.positions[0][index - 1] == 0  # ... first target token
    assert ids == sorted({encode(colour)[0] for colour in item.options})
    assert batch.targets[index] in ids
    vocabulary = len(batcher.processor.tokenizer)

    class Fixed:  # a "model" whose logits at every target position are given
        def __init__(self, logits: torch.Tensor) -> None:
            self.logits = logits
            self.model = lambda **_: SimpleNamespace(last_hidden_state=torch.zeros(2, 9999, 1))

        def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
            return self.logits

    def loss_of(first_token_logits: torch.Tensor) -> float:
        logits = torch.nn.functional.one_hot(batch.targets, vocabulary).float() * 50
        logits[index] = first_token_logits
        return target_loss(Fixed(logits), batch)[0].item()

    sure_of_it = torch.zeros(vocabulary)
    sure_of_it[batch.targets[index]] = 50.0
    even = torch.full((vocabulary,), -50.0)
    even[ids] = 0.0
    leaning = even.clone()
    leaning[batch.targets[index]] = 0.5  # still unsure, a little less so
    assert loss_of(even) < loss_of(leaning) < loss_of(sure_of_it)


def test_a_hard_item_teaches_a_zoom_into_its_cell_then_the_answer():
    item = make_item(5, difficulty="hard")
    views = make_views(item, SMALL_RULE, AGENT_RULE)
    assert views.crop.size == (224, 224) and views.agent.size == (224, 224)
    screen, name, zoom, answer = agent_examples(item, views, AGENT_RULE)
    assert screen.messages[-1].content == ["yes"]
    assert name.messages[-1].content == [item.shape] and item.colour in str(name.messages[0])
    call = zoom.messages[-1].content[0]
    arguments = json.loads(call.split("<tool_call>")[1].split("</tool_call>")[0])["arguments"]
    assert arguments["bbox_2d"] == item.view_box()
    assert answer.messages[-2].content[0] == "<tool_response>"
    assert answer.messages[-1].content[0].endswith(f"<answer>{item.answer}</answer>")
    easy = make_item(5, difficulty="easy")
    screen, *_, direct = agent_examples(easy, make_views(easy, SMALL_RULE, AGENT_RULE), AGENT_RULE)
    assert (
        screen.messages[-1].content == ["no"]
        and "<tool_call>" not in direct.messages[-1].content[0]
    )


def test_a_short_training_run_steps_and_saves(tiny_paths, tmp_path: Path):
    target = tmp_path / "small"
    copy_checkpoint(tiny_paths["small"], target)
    before = (target / "model.safetensors").read_bytes()
    pool = build_pool(8, 2, SMALL_RULE, AGENT_RULE)
    held_out = [
        replace(small_example(item, views.small), kind=item.kind)
        for item, views in build_pool(6, 3, SMALL_RULE, AGENT_RULE)
    ]
    logged: list[str] = []
    report = train(
        target,
        lambda item, views: [small_example(item, views.small)],
        pool,
        minutes=0.01,
        batch_size=4,
        held_out=held_out,
        on_log=logged.append,
    )
    assert report.steps >= 1 and report.loss > 0
    assert report.held_out is not None and set(report.held_out) == {"choice", "yesno"}
    assert all(0 <= share <= 1 for share in report.held_out.values())
    assert logged[-1].startswith("  held-out at the end: choice ")
    assert (target / "model.safetensors").read_bytes() != before


def test_the_localisation_curriculum_draws_zoom_items_of_the_asked_sizes():
    items = curriculum_items(40, seed=5, sizes=(64, 128))
    assert items == curriculum_items(40, seed=5, sizes=(64, 128))  # seeded
    for item in items:
        left, top, right, bottom = item.box
        assert 64 <= right - left <= 128 and right - left == bottom - top
        assert item.others == ()  # a lone target: where it is, before which one
        cell_left, cell_top, cell_right, cell_bottom = item.cell
        assert (
            cell_left <= left and right <= cell_right and cell_top <= top and bottom <= cell_bottom
        )
        views = make_views(item, SMALL_RULE, AGENT_RULE)
        zoom = agent_examples(item, views, AGENT_RULE)[-2]
        assert zoom.kind == "zoom"  # what the curriculum trains on


def test_a_yes_no_trajectory_carries_the_asked_colour_to_the_answer():
    item = next(
        item
        for seed in range(100)
        if (item := make_item(seed, difficulty="hard", kind="yesno")).answer == "no"
    )
    asked = item.question.split()[3]
    assert item.asked == asked != item.colour
    *_, zoom, read = agent_examples(item, make_views(item, SMALL_RULE, AGENT_RULE), AGENT_RULE)
    call = zoom.messages[-1].content[0]
    assert call.startswith(
        f"<think>asked {asked} {item.shape}, the {item.shape} is too small, zoom in</think>"
    )
    arguments = json.loads(call.split("<tool_call>")[1].split("</tool_call>")[0])["arguments"]
    assert arguments["label"] == f"{asked} {item.shape}"
    assert read.messages[-1].content == [
        f"<think>asked {asked} {item.shape}, the {item.shape} is {item.colour}</think> "
        "<answer>no</answer>"
    ]
    assert answer_text(item) == read.messages[-1].content[0]
    choice = make_item(3, kind="choice")
    assert answer_text(choice) == (
        f"<think>the {choice.shape} is {choice.colour}</think> <answer>{choice.answer}</answer>"
    )


def test_set_view_caps_what_the_checkpoint_shows_its_model(tiny_paths, tmp_path: Path):
    target = tmp_path / "small"
    copy_checkpoint(tiny_paths["small"], target)
    set_view(target, 128)
    rule = rule_of(target)
    assert rule.size_for(896, 896) == (128, 128)
    processor = load_processor(str(target))
    pixels = processor.image_processor(images=[make_item(1).render()], return_tensors="pt")
    assert pixels["image_grid_thw"].tolist() == [[1, 8, 8]]  # 128 px / 16 px patches


def test_the_small_models_aux_steps_name_the_shape_of_a_colour_and_the_asked_kind():
    for seed in range(6):
        item = make_item(seed, difficulty="easy")
        answer, name, kind = small_examples(item, make_views(item, SMALL_RULE, AGENT_RULE))
        assert answer.messages[-1].content == [item.answer] and answer.unsure == ()
        assert name.messages[-1].content == kind.messages[-1].content == [item.shape]
        assert f"Which shape is {item.colour}?" in name.messages[0].content[1]
        prompt = kind.messages[0].content[1]  # the real prompt, then the aux question
        assert (
            prompt.startswith(answer.messages[0].content[1])
            and prompt != answer.messages[0].content[1]
        )


def test_on_a_hard_item_the_small_model_is_taught_to_be_unsure_and_names_a_large_shape():
    for seed in range(6):
        item = make_item(seed, difficulty="hard")
        answer, name, kind = small_examples(item, make_views(item, SMALL_RULE, AGENT_RULE))
        assert answer.messages[-1].content == [item.answer]  # teacher forcing goes on ...
        assert answer.unsure == tuple(item.options or ("yes", "no"))  # ... unsure of it
        seen = item.others[0]  # the target is too small to see at the small model's view
        assert name.messages[-1].content == [seen.shape]
        assert f"Which shape is {seen.colour}?" in name.messages[0].content[1]
        assert kind.messages[-1].content == [item.shape]  # the question still asks for it


@pytest.mark.slow
def test_a_small_model_that_has_not_taken_off_starts_over(tiny_paths, tmp_path, monkeypatch):
    from lab.synth import train as training

    for role in ("small", "large"):
        copy_checkpoint(tiny_paths[role], tmp_path / role)
    set_view(tmp_path / "small", 128)
    monkeypatch.setattr(training, "SMALL_WARMUP_MINUTES", 0.005)
    monkeypatch.setattr(training, "LAST_STAGE_MINUTES", 0.005)
    monkeypatch.setattr(training, "PROBE_SECONDS", 0.0)  # a probe before every step
    monkeypatch.setattr(training, "TAKEOFF", (0.0, 1.01))  # never good enough: give up
    reports = training.train_small(tmp_path, 4, seed=0, minutes=0.4)
    assert reports["small"].attempts >= 2  # started over at least once ...
    assert not reports["small"].gave_up  # ... and the last attempt ran to the end
    assert (tmp_path / "small" / "model.safetensors").exists()
    assert not (tmp_path / "small-initial").exists()


def test_a_misread_zoom_teaches_the_answer_unsure_after_its_thought(tiny_paths):
    """The small model's zoom stage: a zoom into another shape's cell, then an answer
    whose first token is taught as an even share of the possible answers (its thought and
    the tags before it as written)."""
    from lab.synth.train import misread_examples

    batcher = Batcher(load_processor(str(tiny_paths["small"])))
    encode, decode = batcher.processor.tokenizer.encode, batcher.processor.tokenizer.decode
    item = make_item(7, difficulty="hard", kind="choice")
    assert item.others
    (misread,) = misread_examples(item, SMALL_RULE)
    other = item.others[0].box
    call = misread.messages[-3].content[0]
    box = json.loads(call.split("<tool_call>")[1].split("</tool_call>")[0])["arguments"]["bbox_2d"]
    view = SMALL_RULE.size_for(896, 896)[0]  # (the small model's view of the 896 px world)
    scale = view / 896
    centre = ((other[0] + other[2]) / 2 * scale, (other[1] + other[3]) / 2 * scale)
    assert box[0] <= centre[0] < box[2] and box[1] <= centre[1] < box[3]  # the other's cell
    assert box != item.view_box(view)
    assert misread.messages[-1].content[0].startswith(misread.unsure_after)
    batch = batcher([misread])
    ((index, ids),) = batch.unsure
    assert index == len(encode(misread.unsure_after)) and ids == sorted(
        {encode(colour)[0] for colour in item.options}
    )
    assert decode(batch.targets[index]) == decode(encode(item.answer)[0])
    alone = make_item(7, difficulty="hard", kind="choice", others=0)
    assert misread_examples(alone, SMALL_RULE) == []  # (no other cell to misread)


def test_the_zoom_stage_alone_trains_the_small_model_in_place(tiny_paths, tmp_path, monkeypatch):
    """--only small-zoom: the small checkpoint already there learns its zooms; the agent
    and what the info file said of the earlier training stay."""
    from lab.synth import train as training

    for role in ("small", "large"):
        copy_checkpoint(tiny_paths[role], tmp_path / role)
    set_view(tmp_path / "small", 128)
    (tmp_path / "synth-info.json").write_text(json.dumps({"small": {"steps": 6000}}))
    small_before = (tmp_path / "small" / "model.safetensors").read_bytes()
    large_before = (tmp_path / "large" / "model.safetensors").read_bytes()
    monkeypatch.setattr(training, "SMALL_ZOOM_CURRICULUM", (((128, 208), 0.01),))
    monkeypatch.setattr(training, "LAST_STAGE_MINUTES", 0.01)
    monkeypatch.setattr(training, "SMALL_ZOOM_HELD_OUT", 6)
    info = training.train_synth(
        tmp_path, items_count=4, only="small-zoom", small_zoom_minutes=0.02, on_log=lambda _: None
    )
    assert (tmp_path / "small" / "model.safetensors").read_bytes() != small_before
    assert (tmp_path / "large" / "model.safetensors").read_bytes() == large_before
    assert info["small"] == {"steps": 6000} and info["small-zoom"]["steps"] > 0
    assert info["runs"][-1]["stages"] == {"small-zoom": 0.02}  # (what this run trained)
    assert info["small-zoom"]["curve"][-1][1] == info["small-zoom"]["held_out"]
    assert {"zoom", "read", "misread", "easy choice"} & set(info["small-zoom"]["held_out"])
