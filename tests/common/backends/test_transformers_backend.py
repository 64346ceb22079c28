"""The transformers backend on the tiny real-architecture checkpoints.

Random weights: these tests assert shapes, batching, stopping and routing, never what
the model says (where the text matters, a logits processor forces it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw

from common.agents.deepeyes import run_deepeyes
from common.backends.transformers_backend import TransformersModel
from common.chat import Conversation
from common.config import AgentSettings
from common.contracts import Query
from common.errors import ConfigurationError
from common.protocols import REFERENCE, THYME, V0, Protocol
from tests.helpers.models import ForceRows, ForceText


def sample_queries() -> list[Query]:
    sizes = [(640, 480), (300, 500), (128, 128), (1000, 260)]
    colours = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (200, 200, 30)]
    questions = ["What colour is it?", "Is there a circle?", "Which shape is shown here?", "Q?"]
    return [
        Query(f"job-{i}", Image.new("RGB", size, colour), question, ("a", "b") if i % 2 else None)
        for i, (size, colour, question) in enumerate(zip(sizes, colours, questions, strict=True))
    ]


def test_the_processor_resize_rule_is_read_from_the_checkpoint(tiny_large, tiny_small):
    assert (tiny_large.processor_rule.factor, tiny_small.processor_rule.factor) == (28, 32)
    assert tiny_large.processor_rule.max_pixels == 64 * 28 * 28
    # images are shown on the protocol's grid; without one, the processor's
    assert tiny_large.resize_rule == REFERENCE.image_grid


@pytest.mark.parametrize("which", ["small", "large"])
def test_batched_and_single_calls_give_the_same_tokens(which, tiny_small, tiny_large):
    model = tiny_small if which == "small" else tiny_large
    queries = sample_queries()
    batched = model.speculate(queries, max_new_tokens=8, top_k=16)
    alone = [model.speculate([q], max_new_tokens=8, top_k=16)[0] for q in queries]
    assert [s.token_ids for s in batched] == [s.token_ids for s in alone]
    for together, single in zip(batched, alone, strict=True):
        assert torch.allclose(
            torch.tensor(together.scores.top_values),
            torch.tensor(single.scores.top_values),
            atol=1e-4,
        )
    screened = model.screen(queries, max_new_tokens=5)
    assert [s.raw_text for s in screened] == [
        model.screen([q], max_new_tokens=5)[0].raw_text for q in queries
    ]


def test_recorded_logits_are_the_models_own_and_their_argmax_is_the_token(tiny_small):
    query = sample_queries()[0]
    (speculation,) = tiny_small.speculate([query], max_new_tokens=6, top_k=8)
    assert len(speculation.scores.top_values) == len(speculation.token_ids) > 0
    assert all(len(row) == 8 for row in speculation.scores.top_values)
    # Re-run the prompt plus the answer through a plain forward pass.
    chat = tiny_small.protocol.speculate_query(query)
    text, images = tiny_small.render(chat), [part for m in chat for part in m.images]
    inputs = tiny_small.processor(text=[text], images=images, return_tensors="pt")
    answer = torch.tensor([speculation.token_ids])
    inputs["input_ids"] = torch.cat([inputs["input_ids"], answer], dim=1)
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    if "mm_token_type_ids" in inputs:
        inputs["mm_token_type_ids"] = torch.cat(
            [inputs["mm_token_type_ids"], torch.zeros_like(answer)], dim=1
        )
    with torch.no_grad():
        logits = tiny_small.model(**inputs).logits[0]
    prompt = inputs["input_ids"].shape[1] - answer.shape[1]
    steps = logits[prompt - 1 : -1]  # the logits that produced each answer token
    assert steps.argmax(-1).tolist() == speculation.token_ids
    recorded = torch.tensor([row[0] for row in speculation.scores.top_values])
    assert torch.allclose(steps.max(-1).values, recorded, atol=1e-4)
    recorded_norm = torch.tensor(speculation.scores.log_normalizer)
    assert torch.allclose(torch.logsumexp(steps, -1), recorded_norm, atol=1e-4)


def test_generation_stops_right_after_a_stop_string(tiny_paths):
    large = TransformersModel(str(tiny_paths["large"]), device="cpu")
    forced = "<think>fine</think> <answer>red</answer> and then more text"
    large.logits_processors = [ForceText(large.tokenizer, [forced], large.eos_ids[0])]
    conversation = Conversation(key="x")
    conversation.add("user", Image.new("RGB", (100, 80)), "What colour?")
    generation = large.generate(conversation, stop=REFERENCE.agent_stop, max_new_tokens=64)
    assert generation.text.endswith("<answer>red</answer>")
    assert "more text" not in generation.text
    assert generation.finish_reason == "stop"


@pytest.mark.parametrize(
    ("protocol", "text"),
    [
        (REFERENCE, "The answer is yellow"),
        (THYME, "The answer is yellow"),
        (V0, "The answer is yell"),
    ],
)
def test_a_stop_keeps_the_whole_token_that_completed_it_as_the_evaluation(
    tiny_paths, protocol, text
):
    """transformers' stop_strings end generate() at the token that completes the string;
    the evaluation decodes every generated token, so the whole of it stays (the tiny
    tokenizer's " yellow" completes "yell"; Qwen's ">\n" completes "</code>" the same
    way). ``v0`` cuts right after the string."""
    model = TransformersModel(str(tiny_paths["large"]), device="cpu", protocol=protocol)
    forced = "The answer is yellow. And more"
    model.logits_processors = [ForceText(model.tokenizer, [forced], model.eos_ids[0])]
    conversation = Conversation(key="x")
    conversation.add("user", Image.new("RGB", (100, 80)), "What colour?")
    generation = model.generate(conversation, stop=["yell"], max_new_tokens=32)
    assert generation.text == text and generation.finish_reason == "stop"


def test_the_length_limit_is_reported(tiny_large):
    conversation = Conversation(key="x")
    conversation.add("user", Image.new("RGB", (100, 80)), "Describe.")
    generation = tiny_large.generate(conversation, stop=["</answer>"], max_new_tokens=3)
    assert generation.new_tokens <= 3
    assert generation.finish_reason in {"length", "eos"}


# v0 shows the image at the tiny processor's own size (252x168); reference on its grid
ZOOMS = [(V0, [63, 42, 189, 126]), (REFERENCE, [112, 84, 336, 252])]


@pytest.mark.parametrize(("protocol", "box"), ZOOMS, ids=["v0", "reference"])
def test_a_forced_zoom_crops_the_right_region_of_the_original(
    tiny_paths, protocol: Protocol, box: list[int]
):
    large = TransformersModel(str(tiny_paths["large"]), device="cpu", protocol=protocol)
    call = {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": box, "label": "box"}}
    steps = [
        f"<think>zoom</think><tool_call>{json.dumps(call)}</tool_call>",
        "<think>it is red</think><answer>red</answer>",
    ]
    large.logits_processors = [ForceText(large.tokenizer, steps, large.eos_ids[0])]
    image = Image.new("RGB", (448, 336), (0, 0, 255))
    ImageDraw.Draw(image).rectangle((112, 84, 335, 251), fill=(255, 0, 0))
    shown: list[list[Image.Image]] = []
    real_generate = large.generate

    def spy(conversation: Conversation, **kwargs):
        shown.append(conversation.images)
        return real_generate(conversation, **kwargs)

    large.generate = spy  # type: ignore[method-assign]
    trajectory = run_deepeyes(Query("q", image, "What colour is the box?"), large, AgentSettings())
    assert trajectory.answer == "red"
    assert trajectory.steps[0].box_original == [112, 84, 336, 252]
    crop = shown[1][-1]
    assert crop.size == large.resize_rule.size_for(224, 168)
    assert set(crop.get_flattened_data()) == {(255, 0, 0)}  # all red: the box, nothing around it


@pytest.mark.parametrize("spec", ["/no/such/folder", "./missing-model"])
def test_a_missing_local_model_is_one_clear_error(spec):
    from common.models.registry import resolve_model

    with pytest.raises(ConfigurationError, match="no checkpoint folder"):
        resolve_model(spec, "small", Path("/tmp"))


def test_an_unreachable_hub_model_is_one_clear_error(monkeypatch):
    import huggingface_hub.constants

    # No hub is reachable here; offline mode answers at once instead of retrying.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigurationError) as error:
        TransformersModel("no-such-org/no-such-model", device="cpu")
    assert "cannot load model 'no-such-org/no-such-model'" in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("protocol", "expected"), [(REFERENCE, "no tools"), (V0, "no")])
def test_only_the_end_of_turn_ends_a_reference_screen(tiny_paths, protocol, expected):
    """The evaluation generates phases I and IV with eos_token_id=None and <|im_end|> as a
    stop string: <|endoftext|> does not end them there (v0 stops at either)."""
    large = TransformersModel(str(tiny_paths["large"]), device="cpu", protocol=protocol)
    forced = ["no<|endoftext|> tools"]
    large.logits_processors = [ForceText(large.tokenizer, forced, large.eos_ids[0])]
    (screen,) = large.screen(sample_queries()[:1], max_new_tokens=12)
    assert screen.raw_text == expected


def test_many_conversations_zoom_in_one_generate_with_each_tokens_scores(tiny_paths):
    """Speculation in depth on the real small architecture: a batch of two zooms, then
    answers; each turn's tokens carry their scores and their text, and the gate reads
    the answer's tokens alone."""
    from common.backends.base import answer_scores
    from common.pipeline.depth import speculate_in_depth

    small = TransformersModel(str(tiny_paths["small"]), device="cpu")
    call = {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [0, 0, 64, 64]}}
    steps = [
        f"<think>zoom</think><tool_call>{json.dumps(call)}</tool_call>",
        "<think>it is red</think><answer>red</answer>",
    ]
    small.logits_processors = [ForceText(small.tokenizer, steps, small.eos_ids[0])]
    calls = []
    real = small.agent_turns

    def spy(conversations, **kwargs):
        generations = real(conversations, **kwargs)
        calls.append(generations)
        return generations

    small.agent_turns = spy  # type: ignore[method-assign]
    images = [Image.new("RGB", (448, 336), (255, 0, 0)), Image.new("RGB", (300, 500))]
    found = speculate_in_depth(
        [Query(f"q{n}", image, "Colour?") for n, image in enumerate(images)],
        small,
        depth=1,
        max_new_tokens=64,
        top_k=8,
    )
    assert [len(generations) for generations in calls] == [2, 2]
    for zoomed in found:
        assert zoomed.speculation is not None and zoomed.speculation.answer == "red"
        assert zoomed.steps[0].box_original is not None
    for generation in calls[1]:
        assert generation.scores is not None and generation.pieces is not None
        assert len(generation.pieces) == len(generation.scores.top_values) == generation.new_tokens
        assert "".join(generation.pieces) == generation.text
        answer = answer_scores(generation).top_values
        assert 0 < len(answer) < generation.new_tokens
        assert all(len(row) == 8 for row in answer)


def test_a_row_that_stops_early_in_a_batch_is_scored_for_its_own_tokens(tiny_paths):
    """Two turns of different lengths in one generate: the short one's batch-mate goes on
    (the short row padded); its scores are its own tokens', one per piece."""
    from common.backends.base import answer_scores

    small = TransformersModel(str(tiny_paths["small"]), device="cpu")
    texts = [
        "<answer>red</answer>",
        "<think>" + "long reasoning " * 6 + "</think><answer>blue</answer>",
    ]
    small.logits_processors = [ForceRows(small.tokenizer, texts, small.eos_ids[0])]
    conversations = []
    for key in ("short", "long"):
        conversation = Conversation(key=key)
        conversation.messages += small.protocol.agent_start(
            small.protocol.view(Image.new("RGB", (200, 200))), "Colour?", None
        )
        conversations.append(conversation)
    short, long = small.agent_turns(conversations, max_new_tokens=64, top_k=4)
    for generation, answer in ((short, "red"), (long, "blue")):
        assert generation.text.endswith(f"<answer>{answer}</answer>")
        assert generation.scores is not None and generation.pieces is not None
        assert len(generation.scores.top_values) == len(generation.pieces) == generation.new_tokens
        rows = answer_scores(generation).top_values
        assert 0 < len(rows) <= 3  # (the answer's own tokens and a tag's edge, not the turn's)


def test_a_turns_pieces_are_its_text_token_by_token_whatever_the_characters(tiny_paths):
    """Each token's piece is what it adds to the decoded text before it (decoded
    incrementally, not prefix by prefix): a character split over tokens shows whole,
    on the token that completes it."""
    small = TransformersModel(str(tiny_paths["small"]), device="cpu")
    text = "<think>é 日本語 🙂 naïve</think> <answer>B</answer>\u00a0x"
    tokens = small.tokenizer.encode(text, add_special_tokens=False)

    def prefix_by_prefix() -> list[str]:  # (the definition, at its quadratic cost)
        pieces, before = [], ""
        for length in range(1, len(tokens) + 1):
            now = small.tokenizer.decode(tokens[:length], skip_special_tokens=True)
            if now.endswith("\ufffd") or not now.startswith(before):
                pieces.append("")
                continue
            pieces.append(now[len(before) :])
            before = now
        return pieces

    pieces = small._pieces(tokens)
    assert list(pieces) == prefix_by_prefix()
    assert "".join(pieces) == text and "" in pieces  # (the emoji spans tokens)
