"""Fixtures shared by the whole suite.

The tiny checkpoints are built once per test session into a temporary cache (seconds),
so no test depends on what a developer's ~/.cache holds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image


@pytest.fixture(scope="session")
def tiny_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from common.models.tiny import ensure_tiny

    cache_dir = tmp_path_factory.mktemp("speceyes-cache")
    ensure_tiny(cache_dir)
    return cache_dir


@pytest.fixture(scope="session")
def tiny_paths(tiny_cache_dir: Path) -> dict[str, Path]:
    from common.models.tiny import tiny_paths

    return tiny_paths(tiny_cache_dir)


@pytest.fixture(scope="session")
def tiny_large(tiny_paths: dict[str, Path]):
    from common.backends.transformers_backend import TransformersModel

    return TransformersModel(str(tiny_paths["large"]), device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def tiny_small(tiny_paths: dict[str, Path]):
    from common.backends.transformers_backend import TransformersModel

    return TransformersModel(str(tiny_paths["small"]), device="cpu", dtype="float32")


def solid_image(
    width: int, height: int, colour: tuple[int, int, int] = (200, 30, 30)
) -> Image.Image:
    return Image.new("RGB", (width, height), colour)
