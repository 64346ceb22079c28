"""Full-size architectures with random weights: GPU speed benchmarks with no model hub.

``write_random_init(folder, preset)`` writes a checkpoint folder without weights: the
architecture's config, the tiny tokenizer, chat template and an image-processor config,
and ``speceyes.json`` with ``{"random_init": true, "seed": ...}``. The transformers
backend then builds the weights on the device at load, seeded (a 7B model in seconds on
a GPU; nothing to download or store). Their answers are meaningless; generation costs
what the real checkpoint's would, token for token.

Presets:

- ``qwen2.5-vl-7b``: Qwen2.5-VL-7B-Instruct's architecture (DeepEyes-7B, Thyme-7B), with
  Qwen's own image bounds (4 to 16384 merged 28 px patches);
- ``test``: the tiny dimensions, to test the path on a CPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import Qwen2_5_VLConfig

from common.errors import ConfigurationError
from common.models.tiny import (
    SEED,
    generation_config,
    model_config,
    train_tokenizer,
    write_text_and_images,
)

PRESETS = ("qwen2.5-vl-7b", "test")

# Qwen2.5-VL-7B-Instruct's config.json, the fields that set its size
QWEN25_VL_7B_TEXT = {
    "vocab_size": 152064,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 128000,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 1000000.0,
        "mrope_section": [16, 24, 24],
    },
}
QWEN25_VL_7B_VISION = {
    "depth": 32,
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "out_hidden_size": 3584,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
}
QWEN25_IMAGE_SIZE = {"shortest_edge": 4 * 28 * 28, "longest_edge": 16384 * 28 * 28}


def write_random_init(folder: Path, preset: str) -> Path:
    """A random-init checkpoint folder of ``preset`` (see the module docstring)."""
    if preset not in PRESETS:
        raise ConfigurationError(f"no preset {preset!r}; presets: {', '.join(PRESETS)}")
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    config = model_config("qwen2_5_vl", tokenizer)
    image_size = None
    if preset == "qwen2.5-vl-7b":
        values = config.to_dict()
        derived = ("layer_types", "max_window_layers")  # follow the depth: computed anew
        text = {k: v for k, v in values["text_config"].items() if k not in derived}
        values["text_config"] = text | QWEN25_VL_7B_TEXT
        values["vision_config"] = values["vision_config"] | QWEN25_VL_7B_VISION
        config = Qwen2_5_VLConfig(**values)
        image_size = QWEN25_IMAGE_SIZE
    config.save_pretrained(folder)
    generation_config(tokenizer).save_pretrained(folder)
    write_text_and_images(folder, "qwen2_5_vl", tokenizer, image_size)
    marker = {"protocol": "reference", "random_init": True, "seed": SEED, "preset": preset}
    (folder / "speceyes.json").write_text(json.dumps(marker, indent=2) + "\n")
    return folder


def random_init_seed(path: str) -> int | None:
    """The seed of a random-init folder (``write_random_init``), or None for a checkpoint."""
    marker = Path(path) / "speceyes.json"
    if not marker.is_file():
        return None
    declared: dict[str, Any] = json.loads(marker.read_text())
    return int(declared.get("seed", SEED)) if declared.get("random_init") else None
