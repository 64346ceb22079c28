"""The tiny checkpoints look like the hub's to every Auto class that loads them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoModelForImageTextToText, AutoTokenizer

from common.models.tiny import SPECIAL_TOKENS, TAG_TOKENS, ensure_tiny, train_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_paths):
    return AutoTokenizer.from_pretrained(tiny_paths["large"])


def test_both_architectures_are_the_real_ones(tiny_paths):
    assert AutoConfig.from_pretrained(tiny_paths["large"]).model_type == "qwen2_5_vl"
    assert AutoConfig.from_pretrained(tiny_paths["small"]).model_type == "qwen3_vl"


def test_checkpoints_are_small_readable_and_untied(tiny_paths):
    for path in tiny_paths.values():
        files = list(path.iterdir())
        assert sum(f.stat().st_size for f in files) < 10_000_000
        assert all(f.stat().st_mode & 0o044 == 0o044 for f in files)  # others may read
        model = AutoModelForImageTextToText.from_pretrained(path)
        embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        assert embed.data_ptr() != head.data_ptr()  # tied tiny embeddings collapse output


def test_special_tokens_keep_qwens_order(tokenizer):
    ids = [tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS + TAG_TOKENS]
    assert ids == list(range(ids[0], ids[0] + len(ids)))
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.padding_side == "left"


def test_agent_tags_survive_skipping_special_tokens(tokenizer):
    text = "<think>a</think><tool_call>{}</tool_call><answer>red</answer><|im_end|>"
    decoded = tokenizer.decode(tokenizer.encode(text), skip_special_tokens=True)
    assert decoded == "<think>a</think><tool_call>{}</tool_call><answer>red</answer>"


def test_the_loaded_tokenizer_splits_exactly_as_trained(tokenizer):
    raw = train_tokenizer()
    text = "What is 1234 of the zoomed-in region? It's <answer>A. red</answer>\n\nok"
    assert tokenizer.encode(text, add_special_tokens=False) == raw.encode(text).ids
    digits = tokenizer.tokenize("2048")
    assert digits == ["2", "0", "4", "8"]  # Qwen's rule: one digit per token


def test_the_chat_template_keeps_its_newlines(tiny_paths):
    config = json.loads((tiny_paths["large"] / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "Qwen2Tokenizer"
    tokenizer = AutoTokenizer.from_pretrained(tiny_paths["large"])
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_builds_are_cached_and_deterministic(tiny_cache_dir: Path, tmp_path: Path):
    paths = ensure_tiny(tiny_cache_dir)
    weights = paths["small"] / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert ensure_tiny(tiny_cache_dir) == paths and weights.stat().st_mtime_ns == before
    again = ensure_tiny(tmp_path)
    for role in ("small", "large"):
        digest = [
            hashlib.sha256((p[role] / "model.safetensors").read_bytes()).hexdigest()
            for p in (paths, again)
        ]
        assert digest[0] == digest[1]
