"""Tiny random-weight checkpoints of the real architectures, built offline.

``build_tiny(folder)`` writes two checkpoints that load through the ordinary Auto
classes exactly as the hub checkpoints do:

- ``large/``: a Qwen2.5-VL (the DeepEyes / Thyme architecture), standing in for M_L;
- ``small/``: a Qwen3-VL (the Qwen3-VL-2B architecture), standing in for M_S.

Each holds a config, seeded random weights, a byte-level BPE tokenizer trained here on
a small built-in corpus with Qwen's exact pre-tokenizer split and Qwen's special tokens
(plus the agent tags), the architecture's real chat template and an image-processor
config. Their answers are
meaningless; they exist so the real code paths (processor, batching, generation, logits)
run in tests and on machines with no model hub.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers.trainers import BpeTrainer
from transformers import (
    AutoModelForImageTextToText,
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen3VLConfig,
)

from common.models.chat_templates import QWEN2_5_VL, QWEN3_VL
from common.protocols import REFERENCE, V0

# Bump when anything below changes: cached builds are keyed by it.
TINY_VERSION = "4"  # 2: rope_theta 10; 3: theta 100, sections [1, 3, 4]; 4: real templates
SEED = 1234

HIDDEN = 64
HEADS = 4
HEAD_DIM = HIDDEN // HEADS
BPE_VOCAB = 1024

# Qwen's pre-tokenizer split (transformers' Qwen2Tokenizer uses the same regex).
QWEN_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen's added tokens in their hub order (special ones first), then the agent tags.
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
TAG_TOKENS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
    "<code>",
    "</code>",
    "<sandbox_output>",
    "</sandbox_output>",
]
FIM_TOKENS = [
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]

_CORPUS_WORDS = (
    "the a an of to in is are was what which where who how many color colour shape object "
    "image picture photo question answer option options final only output letter yes no "
    "left right top bottom above below near far small large big tiny red green blue yellow "
    "orange purple black white gray grey brown pink circle square triangle star cross ring "
    "there it this that with without on at by for from as be would tools tool zoom zoomed "
    "region crop box bbox label think first then call if needed format strictly assistant "
    "user system helpful reliability significantly improve using visual such into reply "
    "function functions name arguments type number array string object required properties "
    "description parameters you may provided signatures within XML tags return json"
)


def tiny_root(cache_dir: Path) -> Path:
    return cache_dir / f"tiny-v{TINY_VERSION}"


def tiny_paths(cache_dir: Path) -> dict[str, Path]:
    root = tiny_root(cache_dir)
    return {"large": root / "large", "small": root / "small"}


def ensure_tiny(cache_dir: Path) -> dict[str, Path]:
    """The tiny checkpoints under ``cache_dir``, built first if missing."""
    paths = tiny_paths(cache_dir)
    if not all((path / "config.json").is_file() for path in paths.values()):
        build_tiny(tiny_root(cache_dir))
    return paths


def build_tiny(folder: Path) -> dict[str, Path]:
    """Build both checkpoints into ``folder`` (atomically: a half build never shows)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-build-", dir=folder.parent))
    try:
        tokenizer = train_tokenizer()
        _write_checkpoint(staging / "large", "qwen2_5_vl", tokenizer)
        _write_checkpoint(staging / "small", "qwen3_vl", tokenizer)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"large": folder / "large", "small": folder / "small"}


def _training_text() -> list[str]:
    """A small corpus covering the prompts, tags, JSON and digits the models will read."""

    lines = [_CORPUS_WORDS]
    # the protocols of tiny-v4 only: a new one's text changes the vocabulary, and so the
    # random models every test was measured on (Thyme's texts encode byte by byte)
    for protocol in (REFERENCE, V0):
        lines += [protocol.screen_system or "", protocol.screen_suffix]
        lines += [protocol.speculate_system or "", protocol.speculate_suffix]
        lines += [protocol.speculate_suffix_with_options, protocol.agent_system]
        lines += [protocol.agent_suffix, protocol.question_block("What is it?", ["a", "b"])]
    lines += [f"A. {w} B. {w}s C. the {w} D. no {w}" for w in _CORPUS_WORDS.split()]
    lines += [
        f'<tool_call>{{"name": "image_zoom_in_tool", "arguments": {{"bbox_2d": [{i}, {i + 7}, '
        f'{i * 3}, {i * 5}], "label": "object"}}}}</tool_call>'
        for i in range(0, 400, 13)
    ]
    return lines * 4


def train_tokenizer() -> Tokenizer:
    """A byte-level BPE with Qwen's split, normaliser, decoder and added tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=BPE_VOCAB,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_text(), trainer=trainer)
    # Added in a fixed order so ids are predictable: specials, then tags, then FIM tokens.
    tokenizer.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS]
    )
    tokenizer.add_tokens(
        [AddedToken(token, special=False, normalized=False) for token in TAG_TOKENS]
    )
    tokenizer.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in FIM_TOKENS]
    )
    return tokenizer


def _token_ids(tokenizer: Tokenizer) -> dict[str, int]:
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS + TAG_TOKENS}
    missing = [token for token, value in ids.items() if value is None]
    if missing:
        raise RuntimeError(f"tokenizer lost tokens {missing}")
    return ids  # type: ignore[return-value]


def model_config(kind: str, tokenizer: Tokenizer) -> Any:
    ids = _token_ids(tokenizer)
    shared: dict[str, Any] = {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": False,  # tied tiny embeddings repeat one token on every row
    }
    text: dict[str, Any] = {
        "vocab_size": tokenizer.get_vocab_size(),
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "num_hidden_layers": 2,
        "num_attention_heads": HEADS,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "tie_word_embeddings": False,
    }
    vision: dict[str, Any] = {
        "depth": 2,
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "num_heads": HEADS,
        "out_hidden_size": HIDDEN,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    if kind == "qwen2_5_vl":
        # mrope sections must sum to head_dim / 2 = 8 frequency pairs, highest first: time,
        # image rows, image columns. Text tokens use all eight alike. Two needs pull apart:
        # - where things are: this ViT has no absolute position embedding, so the text
        #   model must see row/column offsets. At Qwen's theta 1e6 the row/column pairs
        #   turn <= 0.03 rad per step of the 8x8 grid: a zoom box stayed at chance;
        # - what the question says: copying a word ~60 tokens back needs a pair that
        #   barely turns over that distance. At theta 10 the slowest turns 0.13 rad per
        #   token, and the agent could not copy the asked colour (yes / no at chance).
        # Theta 100 with one time pair (images have one time step) gives rows 0.56-0.18
        # and columns 0.1-0.018 rad per step and the text a 0.018 rad pair: measured,
        # 3 min of zoom training on large targets -> 35/48 boxes exact (14/48 with
        # sections [2, 3, 3]), and 4 min of direct answers copy the asked colour.
        text["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": 100.0,
            "mrope_section": [1, 3, 4],
        }
        vision |= {"patch_size": 14, "window_size": 56, "fullatt_block_indexes": [1]}
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **shared)
    text |= {"head_dim": HEAD_DIM}
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": 5_000_000.0,
        "mrope_section": [4, 2, 2],
        "mrope_interleaved": True,
    }
    # deepstack indexes feed text layers and must stay below the text depth.
    vision |= {"patch_size": 16, "num_position_embeddings": 256, "deepstack_visual_indexes": [1]}
    return Qwen3VLConfig(text_config=text, vision_config=vision, **shared)


def _image_processor_config(kind: str) -> dict[str, Any]:
    patch = 14 if kind == "qwen2_5_vl" else 16
    factor = patch * 2
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2_5_VLProcessor" if kind == "qwen2_5_vl" else "Qwen3VLProcessor",
        "do_resize": True,
        "do_rescale": True,
        "do_normalize": True,
        "do_convert_rgb": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "patch_size": patch,
        "temporal_patch_size": 2,
        "merge_size": 2,
        # Small on purpose: tiny worlds must not be upscaled, and CPUs must stay fast.
        "size": {"shortest_edge": 4 * factor * factor, "longest_edge": 64 * factor * factor},
    }


def _write_checkpoint(folder: Path, kind: str, tokenizer: Tokenizer) -> None:
    folder.mkdir(parents=True)
    config = model_config(kind, tokenizer)
    torch.manual_seed(SEED)
    model = AutoModelForImageTextToText.from_config(config)
    model.generation_config = generation_config(tokenizer)
    model.save_pretrained(folder)
    write_text_and_images(folder, kind, tokenizer)


def generation_config(tokenizer: Tokenizer) -> Any:
    """Greedy, ending at ``<|im_end|>`` or ``<|endoftext|>`` (as the hub checkpoints)."""

    ids = _token_ids(tokenizer)
    return GenerationConfig(
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
        bos_token_id=ids["<|endoftext|>"],
        do_sample=False,
    )


def write_text_and_images(
    folder: Path, kind: str, tokenizer: Tokenizer, image_size: dict[str, int] | None = None
) -> None:
    """The tokenizer, the architecture's chat template and the image-processor config
    (``image_size``: the processor's pixel bounds, default the tiny ones)."""

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        padding_side="left",
        model_max_length=32768,
    )
    fast.save_pretrained(folder)
    _patch_json(folder / "tokenizer_config.json", {"tokenizer_class": "Qwen2Tokenizer"})
    template = QWEN2_5_VL if kind == "qwen2_5_vl" else QWEN3_VL
    (folder / "chat_template.jinja").write_text(template)
    processor = _image_processor_config(kind)
    if image_size is not None:
        processor["size"] = image_size
    (folder / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))
    (folder / "processor_config.json").write_text(
        json.dumps({"processor_class": processor["processor_class"]}, indent=2)
    )
    for path in folder.iterdir():  # safetensors are written 0600; others load them too
        path.chmod(0o644)


def _patch_json(path: Path, values: dict[str, Any]) -> None:
    data = json.loads(path.read_text())
    data.update(values)
    path.write_text(json.dumps(data, indent=2))
