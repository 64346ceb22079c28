"""Random-init checkpoints: full-size configs that build their weights at load."""

from __future__ import annotations

from pathlib import Path

import torch

from common.backends.transformers_backend import TransformersModel
from common.models.full_size import random_init_seed, write_random_init
from common.models.registry import declared_protocol


def test_a_random_init_folder_loads_seeded_weights_and_generates(tmp_path: Path):
    folder = write_random_init(tmp_path / "r", "test")
    assert random_init_seed(str(folder)) is not None
    assert not list(folder.glob("*.safetensors"))  # no weights stored
    first, second = (TransformersModel(str(folder), device="cpu") for _ in range(2))
    for a, b in zip(first.model.parameters(), second.model.parameters(), strict=True):
        assert torch.equal(a, b)  # the same weights each load: the seed is in the folder
    assert declared_protocol(str(folder), "large") == "reference"  # served as the reference


def test_the_7b_preset_has_qwen2_5_vl_7bs_size(tmp_path: Path):
    from transformers import AutoConfig, AutoModelForImageTextToText

    folder = write_random_init(tmp_path / "q7", "qwen2.5-vl-7b")
    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):  # sizes only: nothing is allocated
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    assert 8.2e9 < params < 8.4e9  # Qwen2.5-VL-7B-Instruct: 8.29 B, vision tower included
